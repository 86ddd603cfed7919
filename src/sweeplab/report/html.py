"""report.html: the sweep's report as one self-contained page, for a browser and MLflow's artifact viewer.

The page holds what report.md holds, laid out for a screen: the verdict (`<section id="verdict">`) and the
per-configuration table (`<table id="configurations">`, one `<tr data-config="bs=64 α=0.7">` per configuration; a
sweep without replicates has one row per job there) at the top, then the pictures report/figures.py and the report
already wrote (speed_quality.png as `<img id="speed-quality">`, curves.png as `<img id="curves">`, the throughput and
validation plots), embedded as PNG data URIs, then the per-job table, folded. Nothing is fetched: the CSS and the
few lines of script that sort a table when its header is clicked (on a cell's leading number, else its text) are
inline, and no src or href leaves the page. Every text from a run (labels, names, errors) is escaped. The rows,
cells and verdict lines are the report's (sweeplab.report.tables): nothing is computed here.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

CAVEAT_PREFIX = "caveat: "  # sweeplab.study.caveats.PREFIX: the lines the answer must be read with
# picture file -> (its img id, its caption), in the page's order
FIGURES = {
    "speed_quality.png": ("speed-quality", "Speed and quality per configuration"),
    "curves.png": ("curves", "The monitored metric against training time"),
    "throughput.png": ("throughput", "Throughput against batch size"),
    "validation.png": ("validation", "The validation metric of every job"),
}


@dataclass(frozen=True)
class Table:
    """A table as the report built it: `columns`, `rows` ({column: cell text}), `key` the column whose cell names a
    row (its `data-config`), `above` lines (the target, constants hoisted out of the columns), `below` lines (a
    legend)."""

    columns: Sequence[str]
    rows: Sequence[Mapping[str, str]]
    key: str
    above: Sequence[str] = field(default_factory=tuple)
    below: Sequence[str] = field(default_factory=tuple)
    intervals: bool = False  # cells read `median (low–high)`: the interval shown smaller than the median


STYLE = """
body{font:13px/1.35 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:12px 16px;color:#1b1b1b}
h1{font-size:16px;margin:0 0 6px}h2{font-size:14px;margin:12px 0 4px}
#verdict{background:#f3f6fa;border-left:4px solid #2f6fb0;padding:6px 10px;margin-bottom:8px}
#verdict p{margin:1px 0}#verdict p.head{font-weight:600}#verdict p.sub{padding-left:1.5em}
#verdict p.note{color:#555;font-size:12px}
#verdict p.caveat{background:#fff4d6;border-left:4px solid #c98a00;margin:0 0 3px -14px;padding:2px 10px}
p.above,p.below{margin:2px 0;color:#444;font-size:12px}
table{border-collapse:collapse;margin:4px 0}
th,td{border:1px solid #d5d9de;padding:2px 6px;text-align:left;vertical-align:top}
td .ci{color:#666;font-size:11px;overflow-wrap:anywhere}tr.baseline td:first-child{font-weight:600}
th{background:#eef1f4;cursor:pointer;user-select:none}
th[aria-sort=ascending]::after{content:" ▲"}th[aria-sort=descending]::after{content:" ▼"}
tbody tr:nth-child(even){background:#fafbfc}
.figures{display:flex;flex-wrap:wrap;gap:12px}.figures figure{margin:0;flex:1 1 700px;max-width:100%}
.figures img{max-width:100%;height:auto;border:1px solid #e3e6ea}figcaption{font-size:12px;color:#555}
details{margin-top:12px}summary{cursor:pointer;font-weight:600}
/* narrow (MLflow's artifact pane is about 700 px): headers may break inside words, intervals go under their
   medians, so ten columns fit */
@media (max-width:1100px){body{font-size:12px;margin:6px 8px}th,td{padding:1px 3px}
th{font-size:11px;overflow-wrap:anywhere}td .ci{display:block;font-size:10px}}
"""

# Click a header: sort its table's body by that column (again: the other way), on each cell's leading number
# (thousands separators and ∞ understood), cells without one after the numbers, by their text.
SCRIPT = """
(function(){
  function key(cell){
    var t=cell.textContent.trim().replace(/,/g,"");
    var m=t.match(/^[-+]?(\\d+\\.?\\d*|\\.\\d+)(e[-+]?\\d+)?/i);
    if(m)return parseFloat(m[0]);
    if(/^\\+?∞/.test(t))return Infinity;
    if(/^-∞/.test(t))return -Infinity;
    return null;
  }
  function compare(a,b){
    if(a[0]!==null&&b[0]!==null)return a[0]-b[0];
    if(a[0]!==null)return -1;
    if(b[0]!==null)return 1;
    return a[1].localeCompare(b[1]);
  }
  document.querySelectorAll("table.sortable").forEach(function(table){
    table.querySelectorAll("thead th").forEach(function(th,i){
      th.addEventListener("click",function(){
        var down=th.getAttribute("aria-sort")==="ascending";
        table.querySelectorAll("thead th").forEach(function(o){o.removeAttribute("aria-sort");});
        th.setAttribute("aria-sort",down?"descending":"ascending");
        var body=table.tBodies[0],rows=Array.prototype.slice.call(body.rows);
        rows.sort(function(r,s){
          var c=compare([key(r.cells[i]),r.cells[i].textContent],[key(s.cells[i]),s.cells[i].textContent]);
          return down?-c:c;
        });
        rows.forEach(function(r){body.appendChild(r);});
      });
    });
  });
})();
"""


def _text(value: object) -> str:
    return html.escape(str(value), quote=True)


def verdict_section(lines: Sequence[str]) -> str:
    """The verdict's lines: its caveats first (`caveat: ...`, sweeplab.study.caveats) in amber, then the first other
    line as the headline, indented ones (one per configuration) indented, notes in grey."""
    paragraphs = []
    head = next((i for i, line in enumerate(lines) if not line.startswith(CAVEAT_PREFIX)), 0)
    for index, line in enumerate(lines):
        kind = ("caveat" if line.startswith(CAVEAT_PREFIX) else "head" if index == head else
                "sub" if line.startswith(" ") else "note" if line.startswith("note:") else "")
        paragraphs.append(f'<p class="{kind}">{_text(line.strip())}</p>' if kind else f"<p>{_text(line)}</p>")
    return '<section id="verdict">\n' + "\n".join(paragraphs) + "\n</section>"


def _cell(text: str, intervals: bool) -> str:
    """A cell's HTML: with `intervals`, "962.1 (940.2–990.0) [5/5]" as the median then the rest in small grey."""
    median, space, rest = text.partition(" (") if intervals else (text, "", "")
    if not space or not median[:1].isdigit() and median[:1] not in "+-∞":
        return _text(text)
    return f'{_text(median)} <span class="ci">({_text(rest)}</span>'


def table_html(table: Table, table_id: str | None = None) -> str:
    """A sortable table, each body row naming its `key` cell in `data-config` (the baseline's row, whose `quality`
    says so, in bold); `above` and `below` as small lines around it."""
    ident = f' id="{_text(table_id)}"' if table_id else ""
    head = "".join(f'<th scope="col">{_text(c)}</th>' for c in table.columns)
    body = "\n".join(
        f'<tr data-config="{_text(row.get(table.key, ""))}"'
        + (' class="baseline">' if row.get("quality") == "baseline" else ">")
        + "".join(f"<td>{_cell(str(row.get(c, '')), table.intervals)}</td>" for c in table.columns) + "</tr>"
        for row in table.rows
    )
    parts = [f'<p class="above">{_text(line)}</p>' for line in table.above if line]
    parts.append(f'<table{ident} class="sortable">\n<thead><tr>{head}</tr></thead>\n<tbody>\n{body}\n</tbody>\n</table>')
    parts += [f'<p class="below">{_text(line)}</p>' for line in table.below if line]
    return "\n".join(parts)


def figure_html(path: Path) -> str:
    """One picture as an inline PNG; '' for a file the page has no place for or that cannot be read."""
    if path.name not in FIGURES:
        return ""
    try:
        data = base64.b64encode(path.read_bytes()).decode("ascii")
    except OSError:
        return ""
    ident, caption = FIGURES[path.name]
    return (f'<figure><img id="{ident}" alt="{_text(caption)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{_text(caption)} ({_text(path.name)})</figcaption></figure>")


def page(title: str, verdict_lines: Sequence[str], configurations: Table, jobs: Table | None = None,
         figures: Sequence[Path] = (), notes: Sequence[str] = (), time_spent: Table | None = None) -> str:
    """The whole page. `configurations`: the per-configuration table (or, without replicates, the per-job one);
    `jobs`: the per-job table shown folded below the pictures (None when `configurations` already is it);
    `figures`: PNG files (those named in FIGURES are embedded, in FIGURES' order); `notes`: lines at the end;
    `time_spent`: where the jobs' time went (sweeplab.report.cost), folded after the jobs."""
    order = list(FIGURES)
    shown = [f for f in sorted(figures, key=lambda p: order.index(p.name) if p.name in order else len(order))]
    pictures = [block for block in (figure_html(p) for p in shown) if block]
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_text(title)}</title>",
        f"<style>{STYLE}</style></head><body>",
        f"<h1>{_text(title)}</h1>",
        verdict_section(verdict_lines),
        table_html(configurations, "configurations"),
    ]
    if pictures:
        parts.append('<div class="figures">\n' + "\n".join(pictures) + "\n</div>")
    if jobs is not None:
        parts.append(f"<details><summary>per job ({len(jobs.rows)})</summary>\n{table_html(jobs, 'jobs')}\n</details>")
    if time_spent is not None:
        parts.append(f"<details><summary>where the jobs' time went</summary>\n{table_html(time_spent, 'time')}\n"
                     "</details>")
    parts += [f'<p class="below">{_text(line)}</p>' for line in notes if line]
    parts.append(f"<script>{SCRIPT}</script>\n</body></html>\n")
    return "\n".join(parts)
