"""Folded text, the SVG and speedscope: each reads back to the same profile."""

from __future__ import annotations

import json
import random
import xml.etree.ElementTree as ET

import pytest

from inferprobe.analyzers import stack_fold as fold
from inferprobe.flamegraphs import speedscope, svg


def _profile(seed: int = 7, stacks: int = 300) -> fold.Stacks:
    rng = random.Random(seed)
    names = ["main", "serve", "handle<int>(a&, b)", "read_[k]", "py::decode:/srv/app.py",
             "cuLaunchKernel", "[unknown] libfoo.so+0x1a2b", "[truncated]", 'quote"&<amp>', "leaf"]
    out: fold.Stacks = {}
    for _ in range(stacks):
        depth = rng.randint(1, 12)
        key = ("app (42)",) + tuple(rng.choice(names) for _ in range(depth))
        out[key] = out.get(key, 0) + rng.randint(1, 500)
    return out


def test_folded_text_round_trips():
    stacks = _profile()
    assert fold.parse(fold.to_text(stacks)) == stacks


def test_folded_parse_names_the_bad_line():
    with pytest.raises(ValueError, match="line 2"):
        fold.parse("a;b 3\na;b three\n")


def test_svg_is_valid_xml_and_reads_back_to_the_same_counts():
    stacks = _profile()
    text = svg.render(stacks, "test <graph>", "sub & title")
    root = ET.fromstring(text)  # raises on invalid XML
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    assert svg.read_back(text) == fold.parse(fold.to_text(stacks))
    assert int(root.get("data-total")) == fold.total(stacks)


def test_a_stack_that_is_a_prefix_of_another_keeps_its_own_count():
    stacks = {("p", "a"): 5, ("p", "a", "b"): 7, ("p", "c"): 1}
    assert svg.read_back(svg.render(stacks, "t")) == stacks


def test_frame_kinds_get_their_colour_family():
    assert svg.frame_kind("tcp_sendmsg_[k]", 3, 1) == "kernel"
    assert svg.frame_kind("py::main:/x.py", 3, 1) == "python"
    assert svg.frame_kind("cuStreamSynchronize", 3, 1) == "cuda"
    assert svg.frame_kind("[unknown] libcudart.so.12+0x10", 3, 1) == "cuda"
    assert svg.frame_kind("[unknown] libc.so.6+0x10", 3, 1) == "unknown"
    assert svg.frame_kind("[truncated]", 3, 1) == "meta"
    assert svg.frame_kind("app (42)", 1, 1) == "meta"
    assert svg.frame_kind("memcpy", 3, 1) == "native"


def test_differential_graph_is_red_where_a_frame_grew_and_blue_where_it_shrank():
    base = {("p", "grows"): 10, ("p", "shrinks"): 90}
    new = {("p", "grows"): 600, ("p", "shrinks"): 400}  # 10 % -> 60 %, 90 % -> 40 %
    root = ET.fromstring(svg.render(new, "diff", baseline=base))
    fills = {}
    for g in root.iter("{http://www.w3.org/2000/svg}g"):
        if g.get("class") == "f":
            rect = g.find("{http://www.w3.org/2000/svg}rect")
            fills[g.get("data-name")] = (rect.get("fill"), float(g.get("data-delta")))
    colour, delta = fills["grows"]
    assert delta == pytest.approx(50.0)
    assert int(colour[1:3], 16) > int(colour[5:7], 16)  # more red than blue
    colour, delta = fills["shrinks"]
    assert delta == pytest.approx(-50.0)
    assert int(colour[5:7], 16) > int(colour[1:3], 16)  # more blue than red


def test_speedscope_export_round_trips_and_names_its_schema():
    stacks = _profile(3)
    doc = json.loads(speedscope.dumps(stacks, "p", unit="us"))
    assert doc["$schema"] == speedscope.SCHEMA
    assert doc["profiles"][0]["unit"] == "microseconds"
    assert doc["profiles"][0]["endValue"] == fold.total(stacks)
    assert speedscope.read_back(doc) == stacks
