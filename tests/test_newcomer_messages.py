"""Mistakes a newcomer makes in the first hour, each answered in one line that says what to do."""

from __future__ import annotations

import pytest

from sweeplab.core import cli
from sweeplab.core.errors import UserError


def test_a_swept_value_without_dash_m_says_add_m_to_sweep():
    with pytest.raises(UserError) as raised:
        cli.compose("train", ["data.batch_size=32,64"])
    message = str(raised.value)
    assert "\n" not in message and "'data.batch_size=32,64'" in message
    assert "add -m to sweep" in message


def test_no_message_names_an_issue_number():
    """Issue numbers mean nothing to a user: strings the code prints or records never cite one (comments and
    docstrings may)."""
    import ast
    import re
    from pathlib import Path

    import sweeplab

    cited = re.compile(r"\bissues? #?\d+", re.IGNORECASE)
    found = []
    for path in Path(sweeplab.__file__).parent.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docstrings = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)
                      and isinstance(node.value, ast.Constant)}
        found += [f"{path.name}:{node.lineno}: {node.value[:80]!r}" for node in ast.walk(tree)
                  if isinstance(node, ast.Constant) and isinstance(node.value, str)
                  and id(node) not in docstrings and cited.search(node.value)]
    assert not found, found


def test_validation_png_names_every_job_whole_and_colours_by_configuration(tmp_path):
    """validation.png's legend cut names at 48 characters, so `steps=100` read `steps=1`: every name is whole and
    inside the picture, and a configuration's replicates share its colour (one colour per configuration)."""
    from sweeplab.report.plots import curves_figure

    names = [f"bs={b} α={a} rep={r} textbridge small β=0.7 steps=100 cpu" for b in (32, 64) for a in (1.0, 0.7)
             for r in range(3)]
    curves = {n: {"samples": [(i * 100.0, 0.1 * i) for i in range(4)], "seconds": [(i, 0.1 * i) for i in range(4)]}
              for n in names}
    fig = curves_figure(curves, "val/cos", {n: n.split(" rep=")[0] for n in names})
    fig.canvas.draw()
    (legend,) = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == names
    box, page = legend.get_window_extent(), fig.bbox
    assert page.x0 <= box.x0 and box.x1 <= page.x1 and page.y0 <= box.y0 and box.y1 <= page.y1
    by_config: dict[str, set] = {}
    for line in fig.axes[0].get_lines():
        by_config.setdefault(line.get_label().split(" rep=")[0], set()).add(line.get_color())
    assert all(len(c) == 1 for c in by_config.values()) and len({c.pop() for c in by_config.values()}) == 4
