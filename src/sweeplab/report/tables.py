"""Comparison tables and plots from MLflow: the verdict, one row per configuration, one row per job of a sweep (or
an experiment, or a multirun dir). Its command line, `python -m sweeplab.report`, is sweeplab.report.__main__.

report.md starts with the verdict's lines (which configuration reaches the target fastest among those that keep
quality, or the tie, or why there is none: sweeplab.study.record, docs/verdict.md), then the per-configuration
table (medians and intervals over the replicates; short columns, a legend line, settings alike in every row said
once above), then the per-job table. report.csv has both, told apart by its `row` column (job | configuration), under
long, stable column names. report.html (sweeplab.report.html) puts the same verdict and tables and the plots on one
self-contained page; `python -m sweeplab.report` and the sweep print its path last (`report: <path>`). The per-job table: configuration, backend, device, batch size, precision,
compile, median step time, samples/s at that median, spread of the step times, tokens/s, MFU, speedup against the
baseline row or "within noise", stability, final validation metric. Two plots:
throughput.png (samples/s against batch size, one line per backend/precision/compile) and validation.png (the
family's validation metric against step, one line per job). The sweep callback calls `sweep_report` at the end of
every multirun and logs `report.files` as artifacts of the sweep's parent run.
"""

from __future__ import annotations

import csv
import io
import logging
import re
import statistics
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

from sweeplab.core import labels as config_labels
from sweeplab.core import stability
from sweeplab.core.errors import UserError
from sweeplab.core.files import run_lock_is_free, write_text_atomic
from sweeplab.core.records import CONFIGURATION, JOB, JobRun
from sweeplab.families import get_family
from sweeplab.report import apple as report_apple
from sweeplab.report import config_runs
from sweeplab.report import cost as report_cost
from sweeplab.report import figures as report_figures
from sweeplab.report import html as report_html
from sweeplab.report.plots import _figure, curves_plot, lanes_plot, save_figure
from sweeplab.study import caveats
from sweeplab.study.record import (
    VerdictOptions,
    VerdictReport,
    config_columns,
    config_csv_rows,
    config_header,
    config_legend,
    config_rows,
    sweep_verdict,
)
from sweeplab.study.sweep import JobRecord, Sweep, read_sweep
from sweeplab.tracking import naming

log = logging.getLogger(__name__)

# Params every table shows (when present), then the family's own, then whatever else varies between the jobs.
BASE_PARAMS = [JOB.batch_size]
IGNORED_VARYING = {JOB.data_seed}
# the stability column: its configuration run's tag of that name (config_runs) aggregates it
PERF_COLUMNS = ["median step (s)", "samples/s", "spread", "tokens/s", "MFU", "speedup", CONFIGURATION.stability]
STABILITY_NOTE = (
    "samples/s: samples per step / median step time. spread: (p90 - p10) / median of the run's window step times. "
    f"stability: ok, or why the row's speed is unreliable (spread over {stability.NOISY_SPREAD:.0%}, host load over "
    f"{stability.LOADED_HOST:g} per CPU, a host whose own speed wavered over {stability.UNSTEADY_HOST:.0%} "
    f"while the run's steps spread {stability.NOISE_FLOOR:.0%} or more, "
    "compilations or new batch shapes in timed steps, an unsynchronised clock, MPS memory growth, the MPS fallback)."
)
WITHIN_NOISE_NOTE = (
    f"within noise: the two rows differ by less than the larger of their spreads (at least {stability.NOISE_FLOOR:.0%}), "
    "so no speedup is claimed."
)
# With replicates the per-configuration table has the speedups, paired and with intervals: the per-job table shows
# none, as one job against one other job is exactly the single-run comparison the verdict exists to replace.
REPLICATED_NOTE = "per job: no speedup column; the speedups are the per-configuration table's, over the replicates."


@dataclass
class Report:
    rows: list[dict[str, str]]
    columns: list[str]
    markdown: str
    files: list[Path] = field(default_factory=list)
    failed: int = 0
    verdict: VerdictReport | None = None  # the sweep's verdict (sweeplab.study.record); None without a store
    sweep: Sweep | None = None  # what the report read (the sweep callback's `best` and counts read it too)

    @property
    def html(self) -> Path | None:
        """report.html's absolute path; None when nothing was written."""
        return next((p.resolve() for p in self.files if p.name == HTML), None)


def format_number(value: float | None, digits: int = 4) -> str:
    if value is None:
        return ""
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.{digits}g}"


def pick_baseline(sweep: Sweep, baseline: str | None) -> int | None:
    """Row of the per-job table the speedups are against: the job `baseline` names (Sweep.baseline_job: a row number
    or a run-name/id part that picks one configuration); by default the first finished CPU job, else the first
    finished job."""
    usable = [i for i, j in enumerate(sweep.jobs) if j.samples_per_sec]
    if baseline is not None:
        return sweep.jobs.index(sweep.baseline_job(baseline))
    cpu = [i for i in usable if sweep.jobs[i].run.backend == "cpu"]
    return (cpu or usable or [None])[0]


def _family(name: str):
    """The family record of a run's `family` tag; None when the family is not installed where the report runs
    (its rows then show the generic columns)."""
    try:
        return get_family(name)
    except UserError:
        return None


def _column_labels(keys: list[str], family_labels: dict[str, str]) -> dict[str, str]:
    """{key: column header}: its short label; the whole key where two keys of one table share a label (two families'
    α: loss.alpha and model.alpha)."""
    headers: dict[str, str] = {}
    for key in keys:
        short = config_labels.label(key, family_labels, whole_key=True)
        headers[key] = key if short in headers.values() else short
    return headers


def _follows_backend(key: str, jobs: tuple[JobRecord, ...] | list[JobRecord]) -> bool:
    """A `backend.*` setting with one value per backend in the table (backend.name; MLX's backend.device, absent
    elsewhere): it says which backend ran, as the `backend` column does, so a mixed-backend sweep shows one column."""
    if not key.startswith("backend."):
        return False
    values: dict[str, set] = {}
    for job in jobs:
        values.setdefault(job.run.backend or "", set()).add(job.config_value(key))
    return all(len(seen) == 1 for seen in values.values())


def build_rows(sweep: Sweep, baseline: str | None = None) -> tuple[list[dict[str, str]], list[str], int]:
    families = set(sweep.families)
    param_keys = list(BASE_PARAMS)
    labels: dict[str, str] = {}  # the short labels of the families' keys (sweeplab.core.labels), one column per key
    for family in sorted(families):
        record = _family(family)
        param_keys += [k for k in (record.report_keys if record else ()) if k not in param_keys]
        labels.update({k: v for k, v in (record.labels if record else {}).items() if k not in labels})
    # a job that failed before training has no params: it would make every key look varying; its row shows the
    # status and the error only
    configured = [j for j in sweep.jobs if j.params]
    all_keys = sorted({k for j in configured for k in j.params})
    varying = [
        k
        for k in all_keys
        if k not in param_keys and k not in IGNORED_VARYING and len({j.config_value(k) for j in configured}) > 1
        and not _follows_backend(k, configured)
    ]
    param_keys += varying
    headers = _column_labels(param_keys, labels)
    columns = ["run", "status", JOB.backend, JOB.device, *headers.values()]  # the tags' columns, named as the tags
    columns += [JOB.precision, JOB.compile, *PERF_COLUMNS, "final metric"]
    base_index = pick_baseline(sweep, baseline)
    base_metrics = sweep.jobs[base_index].metrics if base_index is not None else {}
    base_rate = sweep.jobs[base_index].run.samples_per_sec if base_index is not None else None
    metric = sweep.metric  # the one metric the report judges, plots and tabulates: the jobs' own monitored metric
    rows, failed = [], 0
    run_again = sweep.run_again()  # superseded by the continued study's run of the same job
    for i, job in enumerate(sweep.jobs):
        m, record = job.metrics, job.run
        status = job.status
        reason = record.slurm_end or record.error or ""  # the scheduler's word first
        if job.run_id in run_again:
            status = f"FAILED, then run again: {reason[:50]}"
        elif status == "FAILED":
            failed += 1
            status = f"FAILED: {reason[:60]}"
        elif status == "KILLED" and reason:  # stopped: by whom (a scheduler's cancel, a signal)
            status = f"KILLED: {reason[:60]}"
        rate = record.samples_per_sec
        speedup = ""
        if rate and base_rate:
            speedup = f"{rate / base_rate:.2f}×"
            if i == base_index:
                speedup += " (baseline)"
            elif stability.within_noise(rate, m, base_rate, base_metrics):
                speedup = f"within noise ({speedup})"
        spread = record.step_time_spread
        row = {
            "run": job.name,
            "status": status,
            JOB.backend: record.backend or "", JOB.device: record.device or "", JOB.precision: record.precision or "",
            JOB.compile: record.compile or "",
            "median step (s)": format_number(record.step_time_median),
            "samples/s": format_number(rate),
            "spread": f"{spread:.1%}" if spread is not None else "",
            "tokens/s": format_number(record.tokens_per_sec),
            "MFU": f"{record.mfu:.1%}" if record.mfu is not None else "",
            "speedup": speedup,
            CONFIGURATION.stability: ("; ".join(stability.problems(m, job.tags)) or "ok") if stability.has_stability_data(m) else "",
            "final metric": f"{metric} {format_number(m[metric])}" if metric in m else "",
        }
        for k in param_keys:
            row[headers[k]] = job.batch_size if k == JOB.batch_size else job.config_value(k, "")
        # what the CSV writes: the unrounded values behind the formatted cells (a speedup inside the noise keeps its
        # ratio; the stability column says why it is not claimed)
        row[NUMBERS] = {
            "median step (s)": record.step_time_median,
            "samples/s": rate,
            "spread": spread,
            "tokens/s": record.tokens_per_sec,
            "MFU": record.mfu,
            "speedup": rate / base_rate if rate and base_rate else None,
            "final metric": m.get(metric),
        }
        rows.append(row)
    return rows, columns, failed


def constant_columns(rows: list[dict[str, str]], columns: list[str], every: str = "run",
                     only: Collection[str] | None = None) -> tuple[str, list[str]]:
    """("every run: backend cpu, precision 32-true", the other columns): the columns with one value in every row
    (but the first, which names the row; with `only`, those of `only`) said once, empty columns dropped; ("",
    columns) for fewer than two rows."""
    if len(rows) < 2:
        return "", columns
    values = {c: {row.get(c, "") for row in rows} for c in columns}
    constant = [c for c in columns[1:] if len(values[c]) == 1 and (only is None or c in only or values[c] == {""})]
    shown = [f"{c} {next(iter(values[c]))}" for c in constant if next(iter(values[c]))]
    return (f"every {every}: " + ", ".join(shown)) if shown else "", [c for c in columns if c not in constant]


def to_markdown(rows: list[dict[str, str]], columns: list[str], hoist_constants: bool = False,
                every: str = "run") -> str:
    """A Markdown table. `hoist_constants`: columns with one value in every row (backend, device, precision...)
    become a line above the table and empty columns go, so the table fits MLflow's artifact viewer."""
    preface = ""
    if hoist_constants:
        line, columns = constant_columns(rows, columns, every)
        preface = f"{line}\n\n" if line else ""
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    lines += ["| " + " | ".join(row.get(c, "") for c in columns) + " |" for row in rows]
    return preface + "\n".join(lines)


_FORMATTED_NUMBER = re.compile(
    r"^(?P<label>[^\d+\-.]*?)\s*(?P<number>[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)?(?:\.\d+)?(?:e[-+]?\d+)?)"
    r"\s*(?P<unit>×|%)?\s*(?:\(baseline\))?$"
)


NUMBERS = "_numbers"  # a row's key holding its numeric cells unformatted (build_rows), for the CSV


def csv_number(cell: str) -> tuple[str, float | None]:
    """A table cell as (label, number): "32" -> ("", 32) (an integer stays one), "1.02× (baseline)" -> ("", 1.02),
    "12.5%" -> ("", 0.125), "val/cos 0.93" -> ("val/cos", 0.93); (cell, None) when it is not a number. A cell
    with thousands separators is a rounded figure (format_number), not an integer."""
    match = _FORMATTED_NUMBER.match(cell.strip())
    if not match or not any(c.isdigit() for c in match["number"]):
        return cell, None
    text = match["number"]
    if match["unit"] is None and re.fullmatch(r"[-+]?\d+", text):
        return match["label"].strip(), int(text)
    value = float(text.replace(",", ""))
    return match["label"].strip(), value / 100 if match["unit"] == "%" else value


def to_csv(rows: list[dict[str, str]], columns: list[str]) -> str:
    """The table as numbers (thousands separators, ×, % and labels gone), so pandas and spreadsheets read numbers:
    integers (a batch size) as integers. A column whose cells carry one label is named by it: the final metric's
    cells "val/cos 0.93" make the column `final val/cos`, as the per-configuration rows name it."""
    def cell(row: dict, column: str) -> tuple[str, float | None]:
        numbers = row.get(NUMBERS) or {}
        if column in numbers:  # the exact value; its label (the final metric's name) from the formatted cell
            label = csv_number(str(row.get(column, "")))[0] if column == "final metric" else ""
            return (label, numbers[column]) if numbers[column] is not None else ("", None)
        return csv_number(str(row.get(column, "")))

    parsed = {c: [cell(row, c) for row in rows] for c in columns}
    header, values = [], {}
    for column in columns:
        cells = parsed[column]
        numeric = [(label, v) for label, v in cells if v is not None]
        blank_or_numeric = all(v is not None or label == "" for label, v in cells)
        if numeric and blank_or_numeric and len({label for label, _ in numeric}) == 1:
            label = numeric[0][0]
            name = (f"final {label}" if column == "final metric" else label) if label else column
            values[name] = [_csv_cell(v) for _, v in cells]
        else:
            name = column
            values[name] = [str(row.get(column, "")) for row in rows]
        header.append(name)
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(header)
    writer.writerows(zip(*(values[name] for name in header)) if rows else [])
    return buffer.getvalue()


# --- plots --------------------------------------------------------------------------------------------
def throughput_points(sweep: Sweep) -> dict[str, list[tuple[int, float]]]:
    """'backend precision compile' -> [(batch size, samples/s)] of every finished job with a throughput."""
    series: dict[str, list[tuple[int, float]]] = {}
    for job in sweep.jobs:
        rate, batch, record = job.samples_per_sec, job.batch_size, job.run
        if not rate or not batch.isdigit():
            continue
        label = f"{record.backend if record.backend is not None else '?'} {record.precision or ''}"
        if record.compile not in (None, "off"):
            label += f" compile={record.compile}"
        device = record.device or ""
        if device:
            label += f" ({device[:28]})"
        series.setdefault(label, []).append((int(batch), rate))
    return series


def throughput_plot(series: dict[str, list[tuple[int, float]]], out: Path) -> Path:
    """Samples/s against batch size: the median of the jobs at each batch size joined by a line, every job a dot."""
    fig = _figure(7.5, 4.5)
    ax = fig.add_subplot()
    batch_sizes = sorted({b for points in series.values() for b, _ in points})
    for label, points in series.items():
        by_batch: dict[int, list[float]] = {}
        for b, rate in points:
            by_batch.setdefault(b, []).append(rate)
        xs = sorted(by_batch)
        line = ax.plot(xs, [statistics.median(by_batch[b]) for b in xs], marker="o", label=label)[0]
        ax.scatter([b for b, _ in points], [rate for _, rate in points], color=line.get_color(), alpha=0.35, s=14)
    if len(batch_sizes) > 1 and batch_sizes[-1] / max(1, batch_sizes[0]) >= 4:
        ax.set_xscale("log", base=2)
    ax.set_xticks(batch_sizes, [str(b) for b in batch_sizes])
    ax.set_xlabel("batch size (samples per step)")
    ax.set_ylabel("training throughput (samples/s)")
    ax.set_ylim(bottom=0)
    ax.set_title("Throughput vs batch size (median of jobs; dots: each job)")
    ax.grid(alpha=0.3)
    if series:
        ax.legend(fontsize=8, loc="best")
    save_figure(fig, out)
    return out


def validation_curves(sweep: Sweep) -> dict[str, dict[str, list[tuple[float, float]]]]:
    """Run label -> {"samples": [(samples seen, value)], "seconds": [(seconds since the run started, value)]} of
    the sweep's monitored metric: the jobs' curves (sweeplab.study.sweep: samples seen = (step + 1) × samples per
    step, as the verdict reads them). Steps are not comparable across batch sizes: at step 100 a bs-64 job has seen
    twice the data of a bs-32 one."""
    return {job.name: {"samples": [(p.samples_seen, p.value) for p in job.curve],
                       "seconds": [(p.wall_seconds, p.value) for p in job.curve]}
            for job in sweep.jobs if job.curve}


def lanes_timeline(jobs) -> dict[str, list[tuple[float, float, str]]]:
    """Lane -> [(start, end) in seconds since the first job started, configuration] of the jobs the GPU lanes
    launcher ran (their run's `lane` tag); empty for another launcher."""
    ran = [(JobRun.from_run(j).lane, j) for j in jobs if j.start_ms is not None and j.end_ms is not None]
    ran = [(lane, j) for lane, j in ran if lane]
    first = min((j.start_ms for _, j in ran), default=0)
    lanes: dict[str, list[tuple[float, float, str]]] = {}
    for lane, j in ran:
        lanes.setdefault(lane, []).append(((j.start_ms - first) / 1000, (j.end_ms - first) / 1000, j.config or j.name))
    return lanes


def gpu_idle_share(jobs) -> float | None:
    """The share of the study's span (first job's start to last job's end) in which a GPU ran no job, averaged over
    the GPUs its jobs ran on (their run's `gpu` tag); None where no job recorded its GPU."""
    spans: dict[str, list[tuple[int, int]]] = {}
    for j in jobs:
        gpu = JobRun.from_run(j).gpu
        if gpu and j.start_ms is not None and j.end_ms is not None:
            spans.setdefault(gpu, []).append((j.start_ms, j.end_ms))
    if not spans:
        return None
    first = min(s for runs in spans.values() for s, _ in runs)
    last = max(e for runs in spans.values() for _, e in runs)
    if last <= first:
        return None
    busy = []
    for runs in spans.values():
        covered, reach = 0, first
        for start, end in sorted(runs):
            covered += max(0, end - max(start, reach))
            reach = max(reach, end)
        busy.append(covered / (last - first))
    return 1 - sum(busy) / len(busy)


def write_plots(sweep: Sweep, out_dir: Path) -> list[Path]:
    files = []
    try:
        if lanes := lanes_timeline(sweep.jobs):
            files.append(lanes_plot(lanes, gpu_idle_share(sweep.jobs), out_dir / "lanes.png"))
        series = throughput_points(sweep)
        if series:
            files.append(throughput_plot(series, out_dir / "throughput.png"))
        curves = validation_curves(sweep)
        if curves:
            groups = {job.name: job.config or job.name for job in sweep.jobs}
            files.append(curves_plot(curves, sweep.metric, out_dir / "validation.png", groups))
    except Exception as exc:  # a plot is a convenience: the table is the report
        log.warning("report plots skipped: %s", exc)
    return files


def write_report(sweep: Sweep, out_dir: Path | None, title: str, baseline: str | None = None,
                 options: VerdictOptions | None = None, never_ran: tuple[str, ...] = (),
                 running: tuple[str, ...] = ()) -> Report:
    """report.md (the verdict's lines first, then the jobs that never ran, the per-configuration table, one row per
    job), report.csv (a `row` column: job | configuration), the plots and report.html (sweeplab.report.html: the
    same tables and the plots, on one page). `running`: the lines said first and in place of a verdict read from
    part of its jobs (a sweep not over yet: `still_running`; job runs deleted in MLflow: `jobs_deleted`)."""
    rows, columns, failed = build_rows(sweep, baseline)
    columns += report_apple.ane_column(sweep.jobs, rows)  # exported runs: their Neural Engine readiness
    base_index = pick_baseline(sweep, baseline)
    options = options or VerdictOptions(baseline_run=baseline)
    found = sweep_verdict(sweep, options) if sweep.uri is not None and not running else None
    if found is not None:  # what the answer must be read with, above it (sweeplab.study.caveats)
        found = caveats.with_caveats(found, caveats.study_caveats(sweep.jobs, found.summary))
    configs = configuration_table(found.summary, sweep) if found is not None and found.summary is not None else None
    if configs is not None:
        columns = [c for c in columns if c != "speedup"]
    job_notes = [REPLICATED_NOTE if configs is not None else
                 f"speedup: samples/s relative to {rows[base_index]['run']!r}" if base_index is not None else "",
                 STABILITY_NOTE + ("" if configs is not None else " " + WITHIN_NOISE_NOTE)]
    job_notes.append(caveats.packing_line(sweep.jobs) or "")  # jobs side by side on a GPU: packed against alone
    if lanes_timeline(sweep.jobs) and (idle := gpu_idle_share(sweep.jobs)) is not None:
        job_notes.append(f"the GPUs ran no job {idle:.0%} of the study's span, first job's start to last job's end "
                         "(lanes.png: each job's start and end per lane)")
    if failed:
        job_notes.append(f"{failed} of {len(rows)} jobs FAILED (reason in the status column and the run's error tag)")
    line, shown = constant_columns(rows, columns)
    jobs = report_html.Table(shown, rows, "run", above=(line,), below=tuple(n for n in job_notes if n))
    verdict_lines = found.lines if found is not None else running or (NO_STORE,)
    markdown = "\n".join(found.lines if found is not None else running) + "\n\n" if found is not None or running else ""
    markdown += "".join(f"{line}\n" for line in never_ran) + ("\n" if never_ran else "")
    markdown += f"## {title}\n\n"
    if configs is not None:
        markdown += f"### per configuration\n\n{_table_markdown(configs)}\n\n### per job\n\n"
    markdown += f"{to_markdown(rows, columns, hoist_constants=True)}\n" + report_apple.ane_lines(sweep.jobs)
    markdown += "".join(f"\n{note}\n" for note in jobs.below)
    started = sweep.run.process_start_s
    time_spent = report_cost.cost_table(sweep.jobs, sweep.run.process_wall_s, sweep.run.uncached_bytecode,
                                        started * 1000 if started else None)
    if time_spent is not None:
        markdown += f"\n### {report_cost.TITLE}\n\n{_table_markdown(time_spent)}\n"
    files: list[Path] = []
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        plots = write_plots(sweep, out_dir)
        plots += report_figures.write_figures(found.summary if found else None, out_dir, report_figures.family_labels(sweep))
        if plots:  # named, not embedded: MLflow's Markdown viewer shows no images (it shows the PNGs themselves)
            markdown += "\nplots beside this file: " + ", ".join(f"`{p.name}`" for p in plots) + "\n"
        markdown += f"\n{HTML_NOTE}\n"
        page = report_html.page(title, (*verdict_lines, *never_ran), configs or jobs, jobs if configs else None,
                                plots, [ln.lstrip("- ") for ln in report_apple.ane_lines(sweep.jobs).splitlines()
                                        if ln.startswith("- ")], time_spent)
        for name, text in (("report.md", markdown), ("report.csv", _csv_with_configurations(sweep, rows, columns, found)),
                           (HTML, page)):
            write_text_atomic(out_dir / name, text)
            files.append(out_dir / name)
        files += plots
    return Report(rows, columns, markdown, files, failed, found, sweep)


HTML = "report.html"
HTML_NOTE = f"{HTML} beside this file: the verdict, these tables (sortable) and the plots on one page, for a browser"
NO_STORE = "no verdict: the report was built without an MLflow store to read the validation curves from"


def configuration_table(summary, sweep: Sweep) -> report_html.Table:
    """The per-configuration table (sweeplab.study.record's cells), its configurations by their short names, the
    target's line above it and the legend below."""
    labels = report_figures.family_labels(sweep)
    names = naming.configuration_run_names([c.config for c in summary.configs], labels)
    rows = config_rows(summary, names)
    # the figures stay in the table even when alike (two configurations of one speed): it is the comparison
    line, columns = constant_columns(rows, config_columns(summary), every="configuration", only=("n",))
    return report_html.Table(columns, rows, "configuration", above=(config_header(summary, names), line),
                             below=(config_legend(summary, labels),), intervals=True)


def _table_markdown(table: report_html.Table) -> str:
    """A table with its lines above and below, as Markdown."""
    return "\n\n".join([*(ln for ln in table.above if ln), to_markdown(list(table.rows), list(table.columns)),
                         *(ln for ln in table.below if ln)])


def _csv_with_configurations(sweep: Sweep, rows: list[dict], columns: list[str], found: VerdictReport | None) -> str:
    """The jobs' table as numbers (`row` job, with its `configuration` tag), then one row per configuration with
    each figure's median (or ratio) and interval bounds, in columns of their own where the jobs have none."""
    for job, row in zip(sweep.jobs, rows):
        row["row"], row["configuration"] = "job", job.config or ""
    table = list(csv.reader(io.StringIO(to_csv(rows, ["row", "configuration", *columns]))))
    header, body = table[0], table[1:]
    extra = config_csv_rows(found.summary) if found is not None and found.summary is not None else []
    for row in extra:
        header += [key for key in row if key not in header]
    body = [cells + [""] * (len(header) - len(cells)) for cells in body]
    body += [[_csv_cell(row.get(key)) for key in header] for row in extra]
    buffer = io.StringIO()
    csv.writer(buffer).writerows([header, *body])
    return buffer.getvalue()


def _csv_cell(value) -> str:
    """A CSV cell: an int as an int (a batch size, a job count), any other number as a float's repr."""
    if value is None:
        return ""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return repr(float(value)) if isinstance(value, float) else str(value)


def jobs_never_run(sweep: Sweep) -> tuple[str, ...]:
    """Lines naming what an interrupted sweep never ran (its parent's `jobs_not_run`, recorded when it closed): how
    many, which (configuration, replicate) pairs are missing among the configurations that ran, and the command
    that continues the sweep. Nothing for a sweep that ran every job or is still running."""
    parent, record = sweep.parent, sweep.run
    not_run, planned = record.jobs_not_run or 0, record.jobs_planned or 0
    if not_run <= 0 or parent.status == "RUNNING":
        return ()
    lines = [f"{not_run} of {planned} planned jobs never ran (the sweep ended {parent.status})"]
    configs = sorted({j.config for j in sweep.jobs if j.config})
    if configs and planned % len(configs) == 0:
        present = {(j.config, j.replicate) for j in sweep.jobs}
        missing = [f"{c} replicate {k}" for k in range(planned // len(configs)) for c in configs
                   if (c, k) not in present]
        if missing:
            lines.append("never ran: " + "; ".join(missing[:10]) + (f"; and {len(missing) - 10} more" if len(missing) > 10 else ""))
    if record.continue_command:  # with the sweep's launcher settings (hydra/launcher=slurm ...)
        lines.append("continue it with: " + record.continue_command)
    elif record.sweep_dir:
        lines.append("continue it with: " + naming.continue_command(
            naming.recorded_overrides(record.sweep_overrides or ""), record.sweep_dir))
    return tuple(lines)


def jobs_deleted(sweep: Sweep) -> tuple[str, ...]:
    """The line of a sweep some of whose job runs were deleted in MLflow (its UI's trash): how many, which, and how
    to bring them back; said in place of a verdict, which the jobs left could only answer wrongly (one replicate
    where there were two, a configuration missing). Nothing when none was deleted."""
    if not sweep.deleted:
        return ()
    total = len(sweep.jobs) + len(sweep.deleted)
    shown = ", ".join(f"{run.name} ({run.run_id})" for run in sweep.deleted[:6]) + (
        f" and {len(sweep.deleted) - 6} more" if len(sweep.deleted) > 6 else "")
    return (f"{len(sweep.deleted)} of {total} jobs' runs are deleted in MLflow: {shown}; no verdict from the "
            f"{len(sweep.jobs)} left: restore them with `mlflow runs restore --run-id <id>` (each) and run the "
            "report again",)


def sweep_report(uri: str, parent_run_id: str, out_dir: Path | None, baseline: str | None = None,
                 options: VerdictOptions | None = None) -> Report:
    """The report of a sweep, read once (sweeplab.study.sweep.read_sweep; the record is `Report.sweep`):
    report.md/.csv/.html and the plots, the verdict as the sweep run's description and one run per configuration
    under it (sweeplab.report.config_runs)."""
    return report_of(read_sweep(uri, parent_run_id), out_dir, baseline, options)


def report_of(sweep: Sweep, out_dir: Path | None, baseline: str | None = None,
              options: VerdictOptions | None = None, running: tuple[str, ...] = ()) -> Report:
    """sweep_report of a sweep already read; `running`: still_running's lines (a report asked for from outside the
    sweep's process: no verdict recorded until the sweep's own report). Job runs deleted in MLflow: jobs_deleted's
    line in place of the verdict, and the sweep run's description left as it was."""
    # the sweep's one name (naming.sweep_id), as its run name and its jobs' tag say it
    title = f"sweep {sweep.run.sweep_id or sweep.parent.run_id[:8]}"
    report = write_report(sweep, out_dir, title, baseline, options, jobs_never_run(sweep),
                          (*running, *jobs_deleted(sweep)))
    if report.verdict is not None:
        config_runs.record_verdict(sweep, report.verdict.lines, report.verdict.summary, report_figures.family_labels(sweep))
    return report


def still_running(sweep: Sweep) -> tuple[str, ...]:
    """For a report asked for while the sweep's run is RUNNING: "still running (2 of 4 jobs done)" while its process
    holds the sweep folder's lock, else (the process is gone: a kill -9, a power cut) that it was interrupted, with
    the command that continues it. Nothing for a sweep that ended."""
    parent = sweep.parent
    if parent is None or parent.status != "RUNNING":
        return ()
    done = sum(job.status == "FINISHED" for job in sweep.jobs)
    record = sweep.run
    planned = record.jobs_planned or 0
    count = f"{done} of {planned} jobs done" if planned else f"{done} job{'s' if done != 1 else ''} done so far"
    sweep_dir = record.sweep_dir
    if sweep_dir and run_lock_is_free(Path(sweep_dir)) and not record.left_jobs:
        command = record.continue_command or naming.continue_command(
            naming.recorded_overrides(record.sweep_overrides or ""), sweep_dir)
        return (f"interrupted ({count}): the sweep's process is gone and left its run RUNNING; no verdict from part "
                f"of its jobs; continue it with: {command}",)
    return (f"still running ({count}): no verdict until its last job ends; run the report again then",)
