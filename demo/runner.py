"""The model side of the engine: prefill one request, decode a batch by one token.

Real batched decoding. Each request keeps its own KV cache (per layer, keys
and values shaped [1, kv_heads, length, head_dim]). A decode step left-pads
every running request's cache to the longest one, stacks them into one
batch, and runs ONE forward over [batch, 1] new tokens with an attention mask
that hides the padding and explicit position ids (each request's own next
position, so the rotary embedding is right whatever the padding). After the
step each request takes back its slice of the grown cache without the
padding. Rebuilding the batch costs one copy of the caches per step, about
what transformers' own DynamicCache costs (it concatenates on every step),
and lets requests join and leave between any two steps: continuous batching.

Prefill runs per request (batch of one, no padding): the engine admits a few
arrivals per iteration within its token budget and prefills them in turn.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from transformers.cache_utils import DynamicCache

from inferprobe.demo.model import LoadedModel


class ModelRunner:
    def __init__(self, lm: LoadedModel) -> None:
        self.model = lm.model
        params = inspect.signature(self.model.forward).parameters
        # transformers 5 renamed past_key_values to cache; accept either.
        self._cache_kw = "cache" if "cache" in params else "past_key_values"

    def _forward(self, cache: DynamicCache, **kwargs: Any) -> torch.Tensor:
        with torch.inference_mode():
            out = self.model(use_cache=True, logits_to_keep=1, **{self._cache_kw: cache}, **kwargs)
        return out.logits[:, -1, :]

    def prefill(self, req: Any) -> int:
        """Run the prompt, keep its KV cache on req.kv, return the first sampled token."""
        cache = DynamicCache()
        logits = self._forward(cache, input_ids=torch.tensor([req.prompt_ids]))
        req.kv = [_keys_values(layer) for layer in cache.layers]
        if req.temperature > 0:
            req.rng = torch.Generator().manual_seed(req.seed)
        return _sample(logits[0], req)

    def decode(self, reqs: list[Any]) -> list[int]:
        """One forward advancing every request by one token; returns the new tokens in order."""
        lengths = [req.kv[0][0].shape[-2] for req in reqs]
        longest = max(lengths)
        batch = len(reqs)
        layers = []
        for layer in range(len(reqs[0].kv)):
            k0, v0 = reqs[0].kv[layer]
            keys = k0.new_empty((batch, k0.shape[1], longest, k0.shape[3]))
            values = v0.new_empty((batch, v0.shape[1], longest, v0.shape[3]))
            for b, (req, n) in enumerate(zip(reqs, lengths, strict=True)):
                # Padding is masked out, but must still be finite: 0 x NaN is NaN.
                keys[b, :, :longest - n] = 0
                values[b, :, :longest - n] = 0
                keys[b, :, longest - n:] = req.kv[layer][0][0]
                values[b, :, longest - n:] = req.kv[layer][1][0]
            layers.append((keys, values))
        mask = torch.zeros((batch, longest + 1), dtype=torch.long)
        for b, n in enumerate(lengths):
            mask[b, longest - n:] = 1
        cache = DynamicCache(ddp_cache_data=layers)
        logits = self._forward(
            cache,
            input_ids=torch.tensor([[req.output_ids[-1]] for req in reqs]),
            attention_mask=mask,
            position_ids=torch.tensor([[n] for n in lengths]),
        )
        tokens = []
        for b, (req, n) in enumerate(zip(reqs, lengths, strict=True)):
            start = longest - n
            req.kv = [(keys[b:b + 1, :, start:], values[b:b + 1, :, start:])
                      for keys, values in map(_keys_values, cache.layers)]
            tokens.append(_sample(logits[b], req))
        return tokens

    @staticmethod
    def free(req: Any) -> None:
        req.kv = None

    def warm_up(self) -> None:
        """One tiny prefill and batched decode, so the first real request does not pay for them."""

        class _Warm:
            prompt_ids = [1, 2, 3, 4]
            temperature = 0.0
            output_ids: list[int] = []

        a, b = _Warm(), _Warm()
        b.prompt_ids = [1, 2]
        for req in (a, b):
            req.output_ids = [self.prefill(req)]
        self.decode([a, b])


def _keys_values(layer: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """A cache layer's keys and values. transformers types a layer as any of its
    kinds, some without keys; the demo's model has full attention only, so every
    layer is one that holds both."""
    return layer.keys, layer.values


def _sample(logits: torch.Tensor, req: Any) -> int:
    if req.temperature <= 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits.float() / req.temperature, dim=-1)
    return int(torch.multinomial(probs, 1, generator=req.rng))
