/* llama.bpf.c: llama.cpp's engine steps, from uprobes on its stable C API.
 *
 * collector/probe_sets/llama.py attaches llama_enter_decode at the entry of
 * llama_decode(struct llama_context *ctx, struct llama_batch batch) and
 * llama_return_decode at its return, in every target that has the symbol
 * (libllama.so, or llama-server itself when libllama is linked in). One
 * call is one engine step: llama-server builds one batch per loop turn with
 * the tokens of every active slot (docs/engines.md).
 *
 * The batch is passed by value. struct llama_batch is 56 bytes (include/
 * llama.h: int32 n_tokens, then six pointers), more than the 16 the SysV
 * x86-64 ABI passes in registers, so the caller copies it onto the stack:
 * at the first instruction of llama_decode it lies at the stack pointer + 8,
 * above the return address.
 *
 * Tokens are not streamed one by one (a prompt batch has up to n_batch,
 * 2048 by default). llama-server lays each slot's tokens out contiguously
 * with consecutive positions, so the batch is summarised as runs: for each
 * run its sequence (seq_id[i][0], the slot id), its first position and
 * length, and whether its last token has logits on (the step samples a token
 * for that sequence). A run's end is found by bisection (a token is in the
 * run when it has the run's sequence and the position its index implies),
 * so a 2048-token prompt costs about 11 reads, not 2048. A batch with more
 * than LLAMA_MAX_RUNS runs is marked truncated.
 *
 * Only ids, positions and counts are read: never a token id, an embedding
 * or anything of the prompt's text.
 */
#include "common.bpf.h"

struct llama_batch_abi {  /* include/llama.h, struct llama_batch */
    s32 n_tokens;
    s32 pad;
    u64 token;            /* llama_token *      (never read) */
    u64 embd;             /* float *            (never read) */
    u64 pos;              /* llama_pos *        */
    u64 n_seq_id;         /* int32_t *          */
    u64 seq_id;           /* llama_seq_id **    */
    u64 logits;           /* int8_t *           */
};


/* 2^16 tokens: far above any n_batch a server runs with. */
#define LLAMA_BISECT_STEPS 16

static __always_inline int llama_token_at(const struct llama_batch_abi *b, s32 i, s32 *seq, s32 *pos)
{
    u64 seq_ptr = 0;
    *pos = -1;
    *seq = 0;
    if (b->pos && bpf_probe_read_user(pos, sizeof(*pos), (void *)(b->pos + 4ULL * (u32)i)))
        return -1;
    if (b->seq_id) {
        if (bpf_probe_read_user(&seq_ptr, sizeof(seq_ptr), (void *)(b->seq_id + 8ULL * (u32)i)))
            return -1;
        if (!seq_ptr || bpf_probe_read_user(seq, sizeof(*seq), (void *)seq_ptr))
            return -1;
    }
    return 0;
}

static __always_inline s32 llama_samples(const struct llama_batch_abi *b, s32 i)
{
    s8 flag = 0;
    if (!b->logits)  /* no output mask: llama_decode outputs the last token only */
        return i == b->n_tokens - 1;
    if (bpf_probe_read_user(&flag, sizeof(flag), (void *)(b->logits + (u32)i)))
        return 0;
    return flag != 0;
}

/* One run per program: llama_enter_decode reads the batch's header, then
 * llama_scan_run finds one run and tail-calls itself for the next, so the
 * verifier checks one bisection at a time (all of them unrolled in one
 * program have too many paths for it; bcc cannot hand bpf_loop a callback).
 * The state between the calls lives in a per-CPU slot. */
struct llama_scan {
    struct llama_step_event ev;
    struct llama_batch_abi b;
    s32 i;      /* first token not yet in a run */
};

BPF_PERCPU_ARRAY(llama_scratch, struct llama_scan, 1);
BPF_PROG_ARRAY(llama_scan_prog, 1);  /* [0] = llama_scan_run, set by collector/probe_sets/llama.py */

static __always_inline int llama_finish(struct llama_scan *sc)
{
    if (sc->i < sc->b.n_tokens)
        sc->ev.truncated = 1;
    return send_event(&sc->ev, sizeof(sc->ev));
}

int llama_scan_run(struct pt_regs *ctx)
{
    u32 zero = 0;
    struct llama_scan *sc = llama_scratch.lookup(&zero);
    if (!sc)
        return 0;
    struct llama_step_event *ev = &sc->ev;
    s32 n = sc->b.n_tokens;
    s32 i = sc->i;
    u32 r = ev->n_runs;
    if (i >= n || i < 0 || r >= LLAMA_MAX_RUNS)
        return llama_finish(sc);
    s32 seq, pos;
    if (llama_token_at(&sc->b, i, &seq, &pos)) {
        ev->truncated = 1;
        return llama_finish(sc);
    }
    s32 lo = i, hi = n;  /* lo: known in the run; hi: first index known past it */
    for (int k = 0; k < LLAMA_BISECT_STEPS; k++) {
        if (hi - lo <= 1)
            break;
        s32 mid = lo + (hi - lo) / 2;
        s32 seq2 = 0, pos2 = 0;
        int bad = llama_token_at(&sc->b, mid, &seq2, &pos2);
        if (!bad && seq2 == seq && (pos < 0 || pos2 == pos + (mid - i)))
            lo = mid;
        else
            hi = mid;
        if (bad)
            ev->truncated = 1;
    }
    struct llama_run *run = &ev->runs[r & (LLAMA_MAX_RUNS - 1)];
    run->seq_id = seq;
    run->pos0 = pos;
    run->n_tokens = lo - i + 1;
    run->last_logits = llama_samples(&sc->b, lo);
    ev->n_runs = r + 1;
    sc->i = lo + 1;
    if (sc->i >= n || ev->n_runs >= LLAMA_MAX_RUNS)
        return llama_finish(sc);
    llama_scan_prog.call(ctx, 0);
    ev->truncated = 1;  /* the tail call failed (the 33-call limit cannot be reached: 16 runs) */
    return llama_finish(sc);
}

int llama_enter_decode(struct pt_regs *ctx)
{
    u32 zero = 0;
    struct llama_scan *sc = llama_scratch.lookup(&zero);
    if (!sc)
        return 0;
    struct llama_batch_abi b = {};
    if (bpf_probe_read_user(&b, sizeof(b), (void *)(PT_REGS_SP(ctx) + 8)))
        return 0;
    __builtin_memset(&sc->ev, 0, sizeof(sc->ev));
    sc->b = b;
    sc->i = 0;
    fill_header(&sc->ev.hdr, EVENT_LLAMA_STEP, bpf_ktime_get_ns(), bpf_get_current_pid_tgid());
    sc->ev.phase = LLAMA_STEP_ENTER;
    sc->ev.n_tokens = b.n_tokens;
    sc->ev.ctx = PT_REGS_PARM1(ctx);
    llama_scan_prog.call(ctx, 0);
    sc->ev.truncated = 1;  /* no scanner installed: the header only */
    return llama_finish(sc);
}

int llama_return_decode(struct pt_regs *ctx)
{
    u32 zero = 0;
    struct llama_scan *sc = llama_scratch.lookup(&zero);
    if (!sc)
        return 0;
    struct llama_step_event *ev = &sc->ev;
    __builtin_memset(ev, 0, sizeof(*ev));
    fill_header(&ev->hdr, EVENT_LLAMA_STEP, bpf_ktime_get_ns(), bpf_get_current_pid_tgid());
    ev->phase = LLAMA_STEP_RETURN;
    ev->ret = (s32)PT_REGS_RC(ctx);
    return send_event(ev, sizeof(*ev));
}
