"""Comparison tables from MLflow: one row per job of a sweep (or an experiment), as Markdown and CSV.

`python -m sweeplab.report` (see `main`), and the sweep callback at the end of every multirun.
"""

from __future__ import annotations

import argparse
import csv
import io
import sys
from dataclasses import dataclass, field
from pathlib import Path

from sweeplab.tracking import mlflow_store

# Params every table shows (when present), then the family's own, then whatever else varies between the jobs.
BASE_PARAMS = ["data.batch_size"]
FAMILY_PARAMS = {
    "textbridge": ["loss.alpha", "loss.beta"],
    "pagating_lm": ["model.unit", "model.alpha", "optim.lr"],
}
FINAL_METRIC = {"textbridge": ("val/cos", "val cos"), "pagating_lm": ("val/ppl", "val ppl")}
SHORT = {"data.batch_size": "bs", "loss.alpha": "α", "loss.beta": "β", "model.unit": "unit", "model.alpha": "α mode"}
IGNORED_VARYING = {"data.seed"}


@dataclass
class Report:
    rows: list[dict[str, str]]
    columns: list[str]
    markdown: str
    files: list[Path] = field(default_factory=list)
    failed: int = 0


def _fmt(value: float | None, digits: int = 4) -> str:
    if value is None:
        return ""
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.{digits}g}"


def child_runs(uri: str, parent_run_id: str):
    client = mlflow_store._client(uri)
    parent = client.get_run(parent_run_id)
    runs = client.search_runs(
        [parent.info.experiment_id],
        filter_string=f"tags.mlflow.parentRunId = '{parent_run_id}'",
        max_results=10000,
        order_by=["attributes.start_time ASC"],
    )
    return runs


def experiment_runs(uri: str, experiment_name: str):
    client = mlflow_store._client(uri)
    experiment = client.get_experiment_by_name(experiment_name)
    if experiment is None:
        raise SystemExit(f"error: no MLflow experiment named {experiment_name!r} in {uri}")
    return client.search_runs(
        [experiment.experiment_id],
        filter_string="tags.`sweeplab.role` != 'sweep'",
        max_results=10000,
        order_by=["attributes.start_time ASC"],
    )


def build_rows(runs) -> tuple[list[dict[str, str]], list[str], int]:
    runs = [r for r in runs if r.data.tags.get("sweeplab.role") != "sweep"]
    families = {r.data.tags.get("family", "") for r in runs}
    param_keys = list(BASE_PARAMS)
    for family in sorted(families):
        param_keys += [k for k in FAMILY_PARAMS.get(family, []) if k not in param_keys]
    all_keys = sorted({k for r in runs for k in r.data.params})
    varying = [
        k
        for k in all_keys
        if k not in param_keys and k not in IGNORED_VARYING and len({r.data.params.get(k) for r in runs}) > 1
    ]
    param_keys += varying
    columns = ["run", "status", "backend", "device", *[SHORT.get(k, k) for k in param_keys]]
    columns += ["precision", "compile", "median step (s)", "samples/s", "tokens/s", "final metric"]
    rows, failed = [], 0
    for r in runs:
        m, tags = r.data.metrics, r.data.tags
        status = r.info.status
        if status == "FAILED":
            failed += 1
            status = f"FAILED: {tags.get('error', '')[:60]}"
        metric, label = FINAL_METRIC.get(tags.get("family", ""), ("val/loss", "val loss"))
        row = {
            "run": tags.get("mlflow.runName", r.info.run_id[:8]),
            "status": status,
            "backend": tags.get("backend", ""),
            "device": tags.get("device", ""),
            "precision": tags.get("precision", ""),
            "compile": tags.get("compile", ""),
            "median step (s)": _fmt(m.get("summary/step_time_s_median")),
            "samples/s": _fmt(m.get("summary/samples_per_sec")),
            "tokens/s": _fmt(m.get("summary/tokens_per_sec")),
            "final metric": f"{label} {_fmt(m[metric])}" if metric in m else "",
        }
        for k in param_keys:
            row[SHORT.get(k, k)] = r.data.params.get(k, "")
        rows.append(row)
    return rows, columns, failed


def to_markdown(rows: list[dict[str, str]], columns: list[str]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    lines += ["| " + " | ".join(row.get(c, "") for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def to_csv(rows: list[dict[str, str]], columns: list[str]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def write_report(runs, out_dir: Path | None, title: str) -> Report:
    rows, columns, failed = build_rows(runs)
    markdown = f"## {title}\n\n{to_markdown(rows, columns)}\n"
    if failed:
        markdown += f"\n{failed} of {len(rows)} jobs FAILED (reason in the status column and the run's error tag)\n"
    files: list[Path] = []
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        for name, text in (("report.md", markdown), ("report.csv", to_csv(rows, columns))):
            mlflow_store.write_text_atomic(out_dir / name, text)
            files.append(out_dir / name)
    return Report(rows, columns, markdown, files, failed)


def sweep_report(uri: str, parent_run_id: str, out_dir: Path | None) -> Report:
    return write_report(child_runs(uri, parent_run_id), out_dir, f"sweep {parent_run_id[:8]}")


def latest_sweep(uri: str, experiment_name: str) -> str | None:
    client = mlflow_store._client(uri)
    experiment = client.get_experiment_by_name(experiment_name)
    if experiment is None:
        return None
    runs = client.search_runs(
        [experiment.experiment_id],
        filter_string="tags.`sweeplab.role` = 'sweep'",
        max_results=1,
        order_by=["attributes.start_time DESC"],
    )
    return runs[0].info.run_id if runs else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sweeplab.report", description=__doc__)
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--sweep", help="parent run id of a sweep (default: the latest sweep)")
    source.add_argument("--multirun-dir", help="a multirun/<date>/<time> directory")
    source.add_argument("--experiment", help="every run of an MLflow experiment")
    parser.add_argument("--experiment-name", default="sweeplab")
    parser.add_argument("--tracking-uri", default=None)
    parser.add_argument("--out", default=None, help="where report.md/.csv go (default: the sweep dir or reports/)")
    args = parser.parse_args(argv)
    uri = mlflow_store.resolve_uri(args.tracking_uri)

    if args.experiment:
        report = write_report(experiment_runs(uri, args.experiment), Path(args.out or "reports"), args.experiment)
    else:
        parent = args.sweep
        out = Path(args.out) if args.out else None
        if args.multirun_dir:
            marker = Path(args.multirun_dir) / "mlflow_parent_run_id"
            if not marker.exists():
                print(f"error: {marker} not found: is {args.multirun_dir} a sweeplab multirun dir?", file=sys.stderr)
                return 2
            parent = marker.read_text().strip()
            out = out or Path(args.multirun_dir)
        parent = parent or latest_sweep(uri, args.experiment_name)
        if parent is None:
            print(f"error: no sweep found in {uri} (experiment {args.experiment_name!r}); run `make sweep` first", file=sys.stderr)
            return 2
        if out is None:
            sweep_dir = mlflow_store._client(uri).get_run(parent).data.tags.get("sweep_dir")
            out = Path(sweep_dir) if sweep_dir and Path(sweep_dir).exists() else Path("reports")
        report = sweep_report(uri, parent, out)
    print(report.markdown)
    print("written: " + ", ".join(str(p) for p in report.files))
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
