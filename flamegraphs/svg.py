"""A self-contained interactive flame graph SVG, rendered here.

Written by hand rather than by shelling out to flamegraph.pl (Perl, another
project's code) or pulling in inferno (a Rust binary): the layout is a few
dozen lines, and owning it lets the graph carry what inferprobe knows (frame
kinds, lost-stack counters, differential colours) and be parsed back by the
round-trip test.

Every frame is drawn as static SVG (it reads in any viewer); a small script
adds the hover tooltip with weight and percent, click to zoom, reset, and
search/highlight. Each frame's <g> carries its name, depth, x offset and
weight as data- attributes, which is also what read_back() parses.
"""

from __future__ import annotations

import colorsys
import re
import zlib
from dataclasses import dataclass, field
from xml.sax.saxutils import escape, quoteattr

from inferprobe.analyzers.stack_fold import Stacks

FRAME_H = 17
HEADER_H = 66
FOOTER_H = 30
FONT_PX = 12
CHAR_PX = 7.0  # monospace advance at 12 px, for label fitting
PAD = 10

KIND_NAMES = {
    "kernel": "kernel",
    "native": "native",
    "python": "Python",
    "cuda": "CUDA library",
    "unknown": "unresolved",
    "meta": "process / marker",
}
CUDA_NAME = re.compile(
    r"^(cu[A-Z]\w*|cuda\w*|__cuda\w*|nccl\w*|cublas\w*|cudnn\w*|cufft\w*|curand\w*|cusparse\w*|"
    r"\[unknown\] lib(cuda|cudart|cublas|cudnn|nccl|nvrtc|cufft|curand|cusparse)\S*)"
)


def frame_kind(name: str, depth: int, root_levels: int) -> str:
    if depth <= root_levels or name.startswith(("[truncated]", "[lost", "[preempted")):
        return "meta"
    if name.endswith("_[k]"):
        return "kernel"
    if name.startswith("py::"):
        return "python"
    if CUDA_NAME.match(name):
        return "cuda"
    if name.startswith("[unknown]"):
        return "unknown"
    return "native"


# (hue range in degrees, saturation, lightness range): a frame's exact shade
# comes from a hash of its name, so the same function keeps its colour.
_PALETTE = {
    "kernel": ((20, 40), 0.80, (0.55, 0.68)),
    "native": ((0, 55), 0.75, (0.58, 0.70)),
    "python": ((95, 150), 0.50, (0.55, 0.68)),
    "cuda": ((265, 295), 0.45, (0.62, 0.74)),
    "unknown": ((0, 10), 0.10, (0.72, 0.80)),
    "meta": ((210, 220), 0.08, (0.80, 0.86)),
}


def _hex(h: float, s: float, l_: float) -> str:
    r, g, b = colorsys.hls_to_rgb(h / 360, l_, s)
    return f"#{int(r * 255):02x}{int(g * 255):02x}{int(b * 255):02x}"


def kind_colour(kind: str, name: str) -> str:
    (h0, h1), sat, (l0, l1) = _PALETTE[kind]
    v = zlib.crc32(name.encode()) / 0xFFFFFFFF
    return _hex(h0 + (h1 - h0) * v, sat, l0 + (l1 - l0) * (1 - v))


def diff_colour(delta: float, scale: float) -> str:
    """Red grows, blue shrinks; white is no change (delta in share points)."""
    if scale <= 0 or delta == 0:
        return "#f4f4f4"
    t = min(1.0, abs(delta) / scale)
    light = 0.95 - 0.45 * t
    return _hex(0 if delta > 0 else 220, 0.85, light)


@dataclass
class Node:
    name: str
    weight: int = 0
    children: dict[str, Node] = field(default_factory=dict)


def build_tree(stacks: Stacks) -> Node:
    root = Node("all")
    for frames, weight in stacks.items():
        if weight <= 0:
            continue
        node = root
        node.weight += weight
        for name in frames:
            node = node.children.setdefault(name, Node(name))
            node.weight += weight
    return root


def _walk(root: Node):
    """(node, depth, x, path) with children in name order, as flamegraph.pl lays them out."""
    todo: list[tuple[Node, int, int, tuple[str, ...]]] = [(root, 0, 0, ())]
    while todo:
        node, depth, x, path = todo.pop()
        yield node, depth, x, path
        cx = x
        kids = []
        for name in sorted(node.children):
            child = node.children[name]
            kids.append((child, depth + 1, cx, path + (name,)))
            cx += child.weight
        todo.extend(reversed(kids))


def _path_weight(root: Node, path: tuple[str, ...]) -> int:
    node = root
    for name in path:
        child = node.children.get(name)
        if child is None:
            return 0
        node = child
    return node.weight


def render(
    stacks: Stacks,
    title: str,
    subtitle: str = "",
    unit: str = "samples",
    width: int = 1200,
    root_levels: int = 1,
    baseline: Stacks | None = None,
) -> str:
    """The SVG text. baseline: a second profile, to colour by change in share."""
    root = build_tree(stacks)
    total = root.weight
    nodes = list(_walk(root))
    max_depth = max((d for _, d, _, _ in nodes), default=0)
    height = HEADER_H + (max_depth + 1) * FRAME_H + FOOTER_H
    plot_w = width - 2 * PAD
    scale = plot_w / total if total else 0.0

    base_root = build_tree(baseline) if baseline is not None else None
    deltas: list[float] = []
    if base_root is not None:
        for node, _d, _x, path in nodes:
            new_share = node.weight / total if total else 0.0
            old = _path_weight(base_root, path) if path else base_root.weight
            old_share = old / base_root.weight if base_root.weight else 0.0
            deltas.append((new_share - old_share) * 100)
    diff_scale = max((abs(d) for d in deltas[1:]), default=0.0)

    out = [
        '<?xml version="1.0" encoding="UTF-8" standalone="no"?>',
        f'<svg version="1.1" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" data-total="{total}" data-unit={quoteattr(unit)} '
        f'data-width="{plot_w}" data-pad="{PAD}" class="ipflame" onload="ipInit(evt)">',
        # every rule under .ipflame: inlined in an HTML report, an SVG's <style>
        # applies to the whole page (the report's charts included)
        "<style>",
        ".ipflame text { font-family: monospace; font-size: 12px; fill: #111; }",
        ".ipflame .f text { pointer-events: none; }",
        ".ipflame .f rect { stroke: #fff; stroke-width: 0.5; cursor: pointer; }",
        ".ipflame .f:hover rect { stroke: #000; stroke-width: 1; }",
        ".ipflame .hl rect { fill: #e040e0 !important; }",
        ".ipflame .hide { display: none; }",
        ".ipflame .btn { cursor: pointer; fill: #225; text-decoration: underline; }",
        ".ipflame .tip rect { fill: #ffffe8; stroke: #888; }",
        "</style>",
        f'<rect x="0" y="0" width="{width}" height="{height}" fill="#fcfcf8"/>',
        f'<text x="{width / 2}" y="22" text-anchor="middle" style="font-size:16px;font-weight:bold">'
        f"{escape(title)}</text>",
        f'<text x="{width / 2}" y="40" text-anchor="middle" fill="#444">{escape(subtitle)}</text>',
        f'<text class="reset btn hide" x="{PAD}" y="58">Reset zoom</text>',
        f'<text class="search btn" x="{width - PAD}" y="58" text-anchor="end">Search</text>',
        f'<text class="matched" x="{width - PAD - 70}" y="58" text-anchor="end"></text>',
        _legend(baseline is not None, PAD + 100, 58),
        f'<text class="details" x="{PAD}" y="{height - 10}"> </text>',
        '<g class="frames">',
    ]
    for i, (node, depth, x, _path) in enumerate(nodes):
        if node.weight <= 0:
            continue
        w = node.weight * scale
        px = PAD + x * scale
        py = height - FOOTER_H - (depth + 1) * FRAME_H
        if base_root is not None:
            fill = diff_colour(deltas[i], diff_scale)
            extra = f' data-delta="{deltas[i]:.3f}"'
        else:
            fill = kind_colour(frame_kind(node.name, depth, root_levels), node.name)
            extra = ""
        kind = frame_kind(node.name, depth, root_levels)
        label = _fit(node.name, w)
        out.append(
            f'<g class="f" data-name={quoteattr(node.name)} data-d="{depth}" data-x="{x}" '
            f'data-n="{node.weight}" data-k="{kind}"{extra}>'
            f"<title>{escape(node.name)}</title>"
            f'<rect x="{px:.2f}" y="{py}" width="{max(w, 0.0):.2f}" height="{FRAME_H - 1}" '
            f'fill="{fill}" rx="2"/>'
            f'<text x="{px + 3:.2f}" y="{py + FRAME_H - 5}">{escape(label)}</text></g>'
        )
    out.append("</g>")
    out.append(
        '<g class="tip hide"><rect x="0" y="0" width="10" height="36" rx="3"/>'
        '<text class="tip1" x="6" y="15"> </text><text class="tip2" x="6" y="30"> </text></g>'
    )
    out.append(f"<script type=\"text/ecmascript\"><![CDATA[\n{_SCRIPT}\n]]></script>")
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _legend(diff: bool, x: float, y: float) -> str:
    if diff:
        items = [("grew", diff_colour(1, 1)), ("shrank", diff_colour(-1, 1)), ("same", "#f4f4f4")]
    else:
        items = [(label, kind_colour(kind, kind)) for kind, label in KIND_NAMES.items()]
    parts = []
    for label, colour in items:
        parts.append(f'<rect x="{x}" y="{y - 10}" width="10" height="10" fill="{colour}"/>'
                     f'<text x="{x + 14}" y="{y}" fill="#444">{escape(label)}</text>')
        x += 14 + CHAR_PX * len(label) + 12
    return "<g class=\"legend\">" + "".join(parts) + "</g>"


def _fit(name: str, px_width: float) -> str:
    chars = int((px_width - 6) / CHAR_PX)
    if chars < 3:
        return ""
    return name if len(name) <= chars else name[: chars - 2] + ".."


def read_back(svg_text: str) -> Stacks:
    """The folded profile an SVG from render() was drawn from (self weights
    are a frame's weight minus its children's)."""
    import xml.etree.ElementTree as ET

    ns = "{http://www.w3.org/2000/svg}"
    rows = []
    for g in ET.fromstring(svg_text).iter(f"{ns}g"):
        if g.get("class") == "f":
            rows.append((int(g.attrib["data-d"]), int(g.attrib["data-x"]), int(g.attrib["data-n"]),
                         g.attrib["data-name"]))
    rows.sort()
    by_depth: dict[int, list[tuple[int, int, tuple[str, ...]]]] = {}
    child_sum: dict[tuple[str, ...], int] = {}
    weights: dict[tuple[str, ...], int] = {}
    import bisect

    for depth, x, n, name in rows:
        if depth == 0:
            path: tuple[str, ...] = ()
        else:
            parents = by_depth.get(depth - 1, [])
            i = bisect.bisect_right([p[0] for p in parents], x) - 1
            path = parents[i][2] + (name,)
            parent = parents[i][2]
            child_sum[parent] = child_sum.get(parent, 0) + n
        by_depth.setdefault(depth, []).append((x, n, path))
        weights[path] = n
    out: Stacks = {}
    for path, n in weights.items():
        self_w = n - child_sum.get(path, 0)
        if path and self_w > 0:
            out[path] = self_w
    return out


_SCRIPT = r"""
// One closure per graph, rooted at the <svg> that fired load: the same script
// runs standalone and inlined (maybe twice) in an HTML report. ipInit may be
// defined once per graph on a page; every definition is this same code.
function ipInit(evt) {
  var root = evt.currentTarget || evt.target;
  if (root.getAttribute("data-ready")) return;
  var standalone = root === document.documentElement;
  var frames = [], zoom = null, term = null;
  var total = parseInt(root.getAttribute("data-total")) || 1;
  var unit = root.getAttribute("data-unit");
  var width = parseFloat(root.getAttribute("data-width"));
  var pad = parseFloat(root.getAttribute("data-pad"));
  function el(cls) { return root.querySelector("." + cls); }
  var tip = el("tip"), tip1 = el("tip1"), tip2 = el("tip2"), details = el("details");
  function fmt(v) { return v.toString().replace(/\B(?=(\d{3})+(?!\d))/g, ","); }
  function describe(f) {
    var s = fmt(f.n) + " " + unit + ", " + (100 * f.n / total).toFixed(2) + "% of all";
    if (zoom && zoom !== f) s += ", " + (100 * f.n / zoom.n).toFixed(2) + "% of zoomed";
    if (f.delta !== null) {
      var d = parseFloat(f.delta);
      s += ", " + (d >= 0 ? "+" : "") + d.toFixed(2) + " points";
    }
    return s;
  }
  function hover(f) {
    details.textContent = f.name + " (" + describe(f) + ")";
    tip1.textContent = f.name.length > 120 ? f.name.slice(0, 118) + ".." : f.name;
    tip2.textContent = describe(f);
    tip.classList.remove("hide");
    var w = Math.max(tip1.getComputedTextLength(), tip2.getComputedTextLength()) + 12;
    tip.querySelector("rect").setAttribute("width", w);
  }
  function move(e) {
    var pt = root.createSVGPoint(); pt.x = e.clientX; pt.y = e.clientY;
    var p = pt.matrixTransform(root.getScreenCTM().inverse());
    var w = parseFloat(tip.querySelector("rect").getAttribute("width"));
    var x = Math.min(p.x + 12, width + 2 * pad - w - 2);
    tip.setAttribute("transform", "translate(" + Math.max(0, x) + "," + Math.max(0, p.y - 44) + ")");
  }
  function out() { tip.classList.add("hide"); details.textContent = " "; }
  function fit(f, w) {
    var chars = Math.floor((w - 6) / 7);
    if (chars < 3) return "";
    return f.name.length <= chars ? f.name : f.name.slice(0, chars - 2) + "..";
  }
  function zoomTo(z) {
    zoom = z;
    var x0 = z ? z.x : 0, n = z ? z.n : total, scale = width / n;
    el("reset").classList.toggle("hide", !z);
    for (var i = 0; i < frames.length; i++) {
      var f = frames[i], show, x, w;
      if (!z) { show = true; x = f.x; w = f.n; }
      else if (f.d < z.d) { show = f.x <= z.x && z.x + z.n <= f.x + f.n; x = x0; w = n; }
      else { show = f.x >= z.x && f.x + f.n <= z.x + z.n; x = f.x; w = f.n; }
      f.g.classList.toggle("hide", !show);
      if (!show) continue;
      var px = pad + (x - x0) * scale, pw = w * scale;
      f.rect.setAttribute("x", px.toFixed(2));
      f.rect.setAttribute("width", Math.max(pw, 0).toFixed(2));
      f.text.setAttribute("x", (px + 3).toFixed(2));
      f.text.textContent = fit(f, pw);
    }
  }
  function search(t) {
    term = t;
    var re = null;
    if (t) { try { re = new RegExp(t); } catch (err) { re = null; } }
    var spans = [];
    for (var i = 0; i < frames.length; i++) {
      var f = frames[i], hit = re !== null && f.d > 0 && re.test(f.name);
      f.g.classList.toggle("hl", hit);
      if (hit) spans.push([f.x, f.x + f.n]);
    }
    spans.sort(function (a, b) { return a[0] - b[0] || b[1] - a[1]; });
    var covered = 0, end = -1;
    for (var j = 0; j < spans.length; j++) {
      if (spans[j][0] >= end) { covered += spans[j][1] - spans[j][0]; end = spans[j][1]; }
      else if (spans[j][1] > end) { covered += spans[j][1] - end; end = spans[j][1]; }
    }
    el("matched").textContent = re ? "Matched: " + (100 * covered / total).toFixed(2) + "%" : "";
  }
  function askSearch() {
    var t = window.prompt("Search for a frame (regular expression):", term || "");
    if (t !== null) search(t === "" ? null : t);
  }
  var gs = root.querySelectorAll("g.f");
  for (var i = 0; i < gs.length; i++) {
    var g = gs[i];
    var f = {g: g, name: g.getAttribute("data-name"), d: parseInt(g.getAttribute("data-d")),
             x: parseInt(g.getAttribute("data-x")), n: parseInt(g.getAttribute("data-n")),
             delta: g.getAttribute("data-delta"), rect: g.querySelector("rect"),
             text: g.querySelector("text")};
    frames.push(f);
    g.addEventListener("mouseover", hover.bind(null, f));
    g.addEventListener("mousemove", move);
    g.addEventListener("mouseout", out);
    g.addEventListener("click", zoomTo.bind(null, f.d === 0 ? null : f));
  }
  el("reset").addEventListener("click", function () { zoomTo(null); });
  el("search").addEventListener("click", askSearch);
  // keys only when the graph is the whole document: in a report, Ctrl+F is the page's
  if (standalone) {
    document.addEventListener("keydown", function (e) {
      if ((e.ctrlKey && e.key === "f") || e.key === "/") { e.preventDefault(); askSearch(); }
      if (e.key === "Escape") { zoomTo(null); search(null); }
    });
  }
  root.setAttribute("data-ready", "1");
}
"""


def for_html(svg_text: str) -> str:
    """render()'s SVG as an element to paste into an HTML page: no XML
    declaration, and no namespace URL (HTML puts <svg> in the SVG namespace
    itself; the report then holds no URL at all)."""
    if svg_text.startswith("<?xml"):
        svg_text = svg_text.split("\n", 1)[1]
    return svg_text.replace(' xmlns="http://www.w3.org/2000/svg"', "", 1)
