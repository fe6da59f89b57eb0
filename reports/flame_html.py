"""The flame graph pictures of the HTML report, drawn from the folded stacks
the analysis kept (analyzers/stack_profile.py, reports/sections/stacks.py) by flamegraphs/svg.py.

The picture is capped: frames narrower than a share of the total are cut
(fold.prune) before drawing, and the cut is raised while the SVG stays above
MAX_SVG_BYTES, so a long deep profile cannot make the report unwieldy.
`inferprobe flamegraph` draws the uncut graph.
"""

from __future__ import annotations

from inferprobe.analyzers import stack_fold as fold
from inferprobe.flamegraphs import svg
from inferprobe.reports.sections.model import FlameGraph

MIN_SHARES = (0.001, 0.005, 0.01, 0.05)  # tried in order until the SVG fits
MAX_SVG_BYTES = 3_000_000
SVG_WIDTH = 1200


def draw(flame: FlameGraph) -> tuple[str, str]:
    """The SVG element for the HTML, and a caption saying what was cut to fit.

    The SVG is trusted markup, pasted unescaped: svg.render escapes the frame names."""
    profile = flame.profile
    for share in MIN_SHARES:
        stacks, dropped = fold.prune(profile.stacks, share)
        text = svg.render(stacks, profile.title, profile.subtitle, profile.unit, width=SVG_WIDTH,
                          root_levels=profile.root_levels)
        if len(text) <= MAX_SVG_BYTES or share == MIN_SHARES[-1]:
            break
    cut = (f"{dropped:,} frames narrower than {share:.1%} of the total are left out (their weight stays "
           "in the frame below them)" if dropped else "every frame drawn")
    caption = (f"{cut}. Hover for weights, click to zoom, Search to highlight; "
               f"`inferprobe flamegraph {flame.recording_path} --kind {profile.kind}` draws the whole graph.")
    return svg.for_html(text), caption
