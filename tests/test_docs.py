"""The documentation is the repository's own and says what the code does: no tracked file points outside the
checkout, every relative link and `docs/<page>.md#<anchor>` reference resolves, and every metric a run logs is named in
docs/metrics.md."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from omegaconf import open_dict

from conftest import compose_train, smoke_config
from sweeplab.engine.training import train

REPO = Path(__file__).resolve().parents[1]
METRICS_DOC = REPO / "docs" / "metrics.md"

# The design notes the code once cited lived beside the checkout, in a folder of their own. Written with character
# classes so that this file does not itself match a plain grep for those names.
OUTSIDE_NAMES = re.compile(r"\b(?:D[E]SIGN|S[T]YLE)\.md\b|\bshared[/]")
PARENT_PATH = re.compile(r"(?<![\w./])((?:\.\./)+[\w.\-/]*)")
MARKDOWN_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
DOCS_REFERENCE = re.compile(r"(?<![\w./-])(docs/[\w.-]+\.md)(?:#([\w-]+))?")
CODE_FENCE = re.compile(r"^```.*?^```", re.S | re.M)
INLINE_CODE = re.compile(r"`[^`\n]*`")


def tracked_text_files() -> dict[Path, str]:
    """Every regular file git tracks that reads as UTF-8 text (images and the `conf` symlink left out)."""
    try:
        listing = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    files = {}
    for name in listing.decode().split("\0"):
        path = REPO / name
        if not name or path.is_symlink() or not path.is_file():
            continue
        try:
            files[path] = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
    return files


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    text = heading.strip().replace("`", "").lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    found: set[str] = set()
    counts: dict[str, int] = {}
    for line in CODE_FENCE.sub("", markdown).splitlines():
        if match := re.match(r"#{1,6} +(.+?) *#* *$", line):
            anchor = github_anchor(match.group(1))
            n = counts.get(anchor, 0)
            counts[anchor] = n + 1
            found.add(anchor if n == 0 else f"{anchor}-{n}")  # GitHub numbers repeated headings
    return found


def broken_target(target: Path, anchor: str | None) -> str | None:
    """Why a link to `target` (with `anchor`) does not resolve inside the repository; None when it does."""
    target = Path(os.path.normpath(target))
    if not target.is_relative_to(REPO):
        return "outside the repository"
    if not target.exists():
        return "no such file"
    if anchor and target.suffix == ".md" and anchor not in anchors(target.read_text(encoding="utf-8")):
        return f"no heading #{anchor} in {target.relative_to(REPO)}"
    return None


def test_no_tracked_file_refers_to_a_path_outside_the_repository():
    problems = []
    for path, text in tracked_text_files().items():
        where = path.relative_to(REPO)
        for number, line in enumerate(text.splitlines(), start=1):
            if match := OUTSIDE_NAMES.search(line):
                problems.append(f"{where}:{number}: names {match.group(0)!r}, which is not in the repository")
            for relative in PARENT_PATH.findall(line):
                if not Path(os.path.normpath(path.parent / relative)).is_relative_to(REPO):
                    problems.append(f"{where}:{number}: {relative!r} leads outside the repository")
    assert not problems, "\n".join(problems)


def test_every_relative_markdown_link_and_docs_reference_resolves():
    problems = []
    files = tracked_text_files()
    for path, text in files.items():
        where = path.relative_to(REPO)
        if path.suffix == ".md":
            prose = INLINE_CODE.sub("", CODE_FENCE.sub("", text))
            for link in MARKDOWN_LINK.findall(prose):
                if re.match(r"[a-z][a-z0-9+.-]*:", link):  # http:, https:, mailto:
                    continue
                file_part, _, anchor = link.partition("#")
                target = path.parent / file_part if file_part else path
                if (why := broken_target(target, anchor or None)) is not None:
                    problems.append(f"{where}: link ({link}): {why}")
        for reference, anchor in DOCS_REFERENCE.findall(text):  # code and config comments cite docs/ by path
            if (why := broken_target(REPO / reference, anchor or None)) is not None:
                problems.append(f"{where}: {reference}{'#' + anchor if anchor else ''}: {why}")
    assert not problems, "\n".join(problems)


def documented_metric_patterns() -> list[re.Pattern]:
    """The names in the first column of docs/metrics.md's tables; `<i>`, `<variant>`, ... stand for one path part."""
    patterns = []
    for line in METRICS_DOC.read_text(encoding="utf-8").splitlines():
        if not line.startswith("|"):
            continue
        first_cell = line.split("|")[1]
        for name in re.findall(r"`([^`\s]+)`", first_cell):
            parts = re.split(r"(<[^>]*>)", name)
            patterns.append(re.compile("".join("[^/]+" if p.startswith("<") else re.escape(p) for p in parts)))
    return patterns


def undocumented(names, patterns: list[re.Pattern]) -> list[str]:
    return sorted(n for n in set(names) if not any(p.fullmatch(n) for p in patterns))


def test_every_metric_name_in_the_code_is_documented():
    """Literal names in src/ include those a CPU smoke run never logs (train/mfu, summary/mfu on CUDA)."""
    literal = re.compile(r"""["']((?:train|val|summary|bench)/\w+)["']""")
    names = {m for path in (REPO / "src").rglob("*.py") for m in literal.findall(path.read_text(encoding="utf-8"))}
    assert {"train/loss", "val/cos", "summary/samples_per_sec"} <= names  # the scan itself finds names
    assert undocumented(names, documented_metric_patterns()) == []


@pytest.mark.slow  # two smoke runs: ~6 s on a quiet 2-core machine, 26-36 s with the load of five engineers
def test_every_metric_a_smoke_run_logs_is_documented(demo_dir, mlflow_uri, tmp_path):
    """Names built at run time too (`alpha/layer_<i>`, `summary/alpha/layer_<i>`, Lightning's `epoch`)."""
    lm = compose_train(["model=pagating_lm", "debug=smoke", f"paths.data_dir={tmp_path / 'data'}", "model.block_size=32"])
    with open_dict(lm):
        lm.trainer.enable_progress_bar = False
    for family, cfg in (("textbridge", smoke_config(demo_dir)), ("pagating_lm", lm)):
        train(cfg, output_dir=tmp_path / family)
    client = MlflowClient(mlflow_uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert {r.data.tags["family"] for r in runs} == {"textbridge", "pagating_lm"}
    logged = {name for r in runs for name in r.data.metrics}
    assert {"train/loss", "val/cos", "val/ppl", "alpha/layer_0", "summary/step_time_s_median"} <= logged
    assert undocumented(logged, documented_metric_patterns()) == []


def test_the_readmes_config_group_table_lists_every_group_and_option_in_conf():
    """README's "The main knobs" table: one row per config group folder of conf/ (hydra/launcher included), naming
    every option (YAML file) in it, and no group that is not there."""
    conf = REPO / "conf"
    groups = {str(d.relative_to(conf)): sorted(p.stem for p in d.glob("*.yaml"))
              for d in conf.rglob("*") if d.is_dir() and any(d.glob("*.yaml"))}
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme.split("## The main knobs", 1)[1].split("\n## ", 1)[0]
    table = {}
    for line in section.splitlines():
        cells = line.split("|")[1:-1]
        if len(cells) >= 2 and (group := re.fullmatch(r"\s*`([\w/]+)`\s*", cells[0])):
            table[group.group(1)] = sorted(re.findall(r"`([\w.]+)`", cells[1]))
    assert sorted(table) == sorted(groups)
    assert {g: o for g, o in table.items() if o != groups[g]} == {}, groups


def test_make_clean_leaves_nothing_sweeplab_writes(tmp_path):
    """What a sweep, report, export, bench, profile and order check write under the checkout (tests/conftest.py's
    list, the store's lock and journal, the bench's tiled data, a pip-built example) is gone after `make clean`;
    the prepared data and the tracked multirun/.gitkeep stay."""
    from conftest import WRITTEN_BY_SWEEPLAB

    (tmp_path / "Makefile").write_text((REPO / "Makefile").read_text())
    written = [name if name.startswith("mlflow.db") else f"{name}/x/file" for name in WRITTEN_BY_SWEEPLAB]
    written += ["mlflow.db.lock", "mlflow.db-journal", "data/bench/tiled.efb1",
               "multirun/2026-01-02/03-04-05/0/.sweeplab.lock", "reports/bench/x/bench.md", "reports/profile/x/profile.md",
               "multirun/order_check/x/forward.log", "examples/mlp_regressor/build/lib/x.py",
               "examples/mlp_regressor/sweeplab_mlp_regressor.egg-info/PKG-INFO"]
    kept = ["data/textbridge_demo/train.jsonl", "multirun/.gitkeep", "examples/mlp_regressor/pyproject.toml"]
    for name in written + kept:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        if not (tmp_path / name).exists():
            (tmp_path / name).write_text("x")
    subprocess.run(["make", "clean"], cwd=tmp_path, check=True, capture_output=True)
    assert [n for n in written if (tmp_path / n).exists()] == []
    assert [n for n in kept if not (tmp_path / n).exists()] == []


def test_the_source_map_and_the_docs_index_match_the_tree():
    """docs/usage.md's Layout names every package and top-level module of src/sweeplab and nothing that is gone;
    docs/README.md lists every page of docs/."""
    repo = Path(__file__).resolve().parents[1]
    layout = (repo / "docs" / "usage.md").read_text(encoding="utf-8").split("## Layout", 1)[1].split("```")[1]
    tree = repo / "src" / "sweeplab"
    present = {f"{p.name}/" for p in tree.iterdir() if (p / "__init__.py").exists()}
    present |= {p.name for p in tree.glob("*.py") if p.name != "__init__.py"}
    named = set(re.findall(r"^  ([\w]+/|[\w]+\.py)", layout, re.M))
    named |= {n.strip() for line in re.findall(r"^  ([\w.]+\.py(?:, [\w.]+\.py)+)", layout, re.M) for n in line.split(",")}
    assert present - named == set() and named - present == set()
    index = (repo / "docs" / "README.md").read_text(encoding="utf-8")
    pages = {p.name for p in (repo / "docs").glob("*.md")} - {"README.md"}
    assert {p for p in pages if f"]({p})" not in index} == set()


def test_the_verdict_page_lists_the_reports_columns_from_figures():
    """docs/verdict.md's table of the report's columns is verdict.FIGURES's (figures_table), not a hand-kept list: a
    figure added to FIGURES fails here until the page shows it."""
    from sweeplab.study.verdict.records import figures_table

    text = (REPO / "docs" / "verdict.md").read_text(encoding="utf-8")
    listed = text.split("<!-- figures_table: begin -->\n", 1)[1].split("<!-- figures_table: end -->", 1)[0]
    assert listed == figures_table(), "docs/verdict.md: replace the table with figures_table()'s:\n" + figures_table()
