"""The MLflow run records sweeplab writes and reads, declared once: the job run, the sweep run, the configuration run.

Each record is a frozen dataclass; a field is declared once beside its type, its MLflow key and its kind (tag, param
or metric) in the field's metadata (`tag("family")`, `metric("summary/samples_per_sec")`), and a docstring per group
of fields says what they mean and in which unit (docs/metrics.md lists the same keys for users).

Writers build a record with the fields they know, all others left None (a partial record is normal: the sweep's
job counts are `SweepRun(jobs_done=3, jobs_failed=0, ...)`), and hand it to `sweeplab.tracking.mlflow_store.write`,
which logs `record.to_mlflow()` in one batch. Readers build a record from a run (`JobRun.from_run(run)`: a
`tracking.mlflow_store.RunRecord`, or anything with `tags`, `params` and `metrics` mappings), or, where they need a
key's name (a search filter, a metric history, a dict read), take it from a key namespace by the field's name:
`JOB.samples_per_sec == "summary/samples_per_sec"`, `SWEEP.jobs_done == "jobs_done"`. A templated key
(`summary/wall_breakdown/{part}_s`, `sweep.{key}`) is a mapping field: its namespace entry is the template.

No other module of src/ spells one of these keys as a literal (tests/test_sweep_record.py); no MLflow import here:
the runtime and the core's stability checks, below tracking/, read these names.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

Kind = Literal["tag", "param", "metric"]
KEY, KIND, TEMPLATE = "mlflow_key", "mlflow_kind", "mlflow_template"

# values of the `sweeplab.role` tag (a job run has none): a sweep's run, a configuration's run, and the run that draws
# the target's line in the chart view (one per replicated sweep: sweeplab.report.config_runs)
SWEEP_ROLE, CONFIGURATION_ROLE, TARGET_ROLE = "sweep", "configuration", "target"


def _field(key: str, kind: Kind, template: bool = False) -> Any:
    return dataclasses.field(default=None, metadata={KEY: key, KIND: kind, TEMPLATE: template})


def tag(key: str) -> Any:
    """A field logged as the tag `key`."""
    return _field(key, "tag")


def param(key: str) -> Any:
    """A field logged as the param `key`."""
    return _field(key, "param")


def metric(key: str) -> Any:
    """A field logged as the metric `key`."""
    return _field(key, "metric")


def tags_named(template: str) -> Any:
    """A mapping field: each entry `name: value` is the tag `key_of(template, name)`; a template with several
    placeholders (`export/{variant}/{figure}`) takes tuples of names."""
    return _field(template, "tag", template=True)


def params_named(template: str) -> Any:
    """A mapping field of params, as tags_named."""
    return _field(template, "param", template=True)


def metrics_named(template: str) -> Any:
    """A mapping field of metrics, as tags_named."""
    return _field(template, "metric", template=True)


@dataclass(frozen=True)
class Logged:
    """What one record puts on a run: tag and param values as MLflow's strings, metric values as floats."""

    tags: dict[str, str]
    params: dict[str, str]
    metrics: dict[str, float]

    def __bool__(self) -> bool:
        return bool(self.tags or self.params or self.metrics)


PLACEHOLDER = re.compile(r"\{\w*\}")


def key_of(template: str, *names: str) -> str:
    """A templated key filled in, one name per placeholder: `key_of(JOB.wall_breakdown, "setup") ==
    "summary/wall_breakdown/setup_s"`."""
    filled = iter(names)
    return PLACEHOLDER.sub(lambda _: next(filled), template)


def _pattern(template: str) -> re.Pattern[str]:
    """The keys a template matches: a name per placeholder, the last one any text, the others no `/`."""
    parts = PLACEHOLDER.split(template)
    groups = ["([^/]+)"] * (len(parts) - 2) + ["(.+)"]
    return re.compile(re.escape(parts[0]) + "".join(g + re.escape(p) for g, p in zip(groups, parts[1:])))


def _text(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _parsed(text: Any, kind: Kind, to: Any) -> Any:
    """A stored value as the field's type; None where it does not read as one (a tag `replicate` of "x")."""
    if to is str:
        return str(text)
    if to is bool:
        return str(text).lower() == "true"
    if to is int:
        if kind == "metric":
            return int(text)
        try:
            return int(str(text))  # "-1" too; "1.5" and "x" read as none
        except ValueError:
            return None
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


class _Record:
    """What every record can do: say what it logs (`to_mlflow`) and read itself from a run (`from_run`)."""

    def to_mlflow(self) -> Logged:
        """The tags, params and metrics this record holds (fields left None are not logged)."""
        out: dict[str, dict] = {"tag": {}, "param": {}, "metric": {}}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if value is None:
                continue
            kind, key = f.metadata[KIND], f.metadata[KEY]
            entries = ({key_of(key, *(name if isinstance(name, tuple) else (name,))): v for name, v in value.items()}
                       if f.metadata[TEMPLATE] else {key: value})
            for k, v in entries.items():
                out[kind][k] = float(v) if kind == "metric" else _text(v)
        return Logged(out["tag"], out["param"], out["metric"])

    @classmethod
    def from_run(cls, run: Any) -> Any:
        """The record of a run (`tracking.mlflow_store.RunRecord`: plain `tags`, `params`, `metrics` dicts); a key
        the run lacks leaves its field None, a templated field holds the entries found (None when none)."""
        stores = {"tag": run.tags, "param": run.params, "metric": run.metrics}
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            kind, key, to = f.metadata[KIND], f.metadata[KEY], _value_type(cls, f.name)
            store = stores[kind]
            if f.metadata[TEMPLATE]:
                pattern = _pattern(key)
                found = {(m.group(1) if pattern.groups == 1 else m.groups()): _parsed(v, kind, to)
                         for k, v in store.items() if (m := pattern.fullmatch(k))}
                values[f.name] = found or None
            elif key in store:
                values[f.name] = _parsed(store[key], kind, to)
        return cls(**values)


@functools.cache
def _value_types(cls: type) -> dict[str, Any]:
    """Each field's value type (str, int, float or bool): without `| None`, a mapping field's value type."""
    types = {}
    for name, hint in typing.get_type_hints(cls).items():
        inner = next((a for a in typing.get_args(hint) if a is not type(None)), hint)
        types[name] = typing.get_args(inner)[1] if typing.get_origin(inner) in (Mapping, dict) else inner
    return types


def _value_type(cls: type, name: str) -> Any:
    return _value_types(cls)[name]


class Keys:
    """A record's MLflow keys by field name (`JOB.samples_per_sec`), templates for mapping fields; iterating it gives
    every key."""

    def __init__(self, record: type) -> None:
        self._kinds: dict[str, Kind] = {}
        for f in dataclasses.fields(record):
            setattr(self, f.name, f.metadata[KEY])
            self._kinds[f.metadata[KEY]] = f.metadata[KIND]

    def __iter__(self) -> Iterator[str]:
        return iter(self._kinds)

    def of_kind(self, kind: Kind) -> list[str]:
        return [key for key, k in self._kinds.items() if k == kind]

    def __getattr__(self, name: str) -> str:  # only for names no field has: a mistyped one fails loudly
        raise AttributeError(f"no run-record key named {name!r}")


# --- the job run: one per training job ------------------------------------------------------------------------------


@dataclass(frozen=True)
class JobRun(_Record):
    """One training job's MLflow run (sweeplab.engine.training opens it; docs/metrics.md lists the same keys)."""

    """Identity: its name (swept keys, family, size, backend), the sweep's parent run it is nested under, the command
    that runs it again (the UI's Description)."""
    name: str | None = tag("mlflow.runName")
    parent_run_id: str | None = tag("mlflow.parentRunId")
    description: str | None = tag("mlflow.note.content")

    """What it trains on and how: family, backend (cpu, cuda, mps, mlx) and the device's name, `trainer.precision`,
    the compile mode, CUDA graphs, the validation metric it monitors and its direction ("max" | "min"), library
    versions, the checkout's commit, what this Python was built for and whether Rosetta translates it, whether MPS
    sent ops it lacks to the CPU, the presets it was composed with (`preset.debug` = smoke, ...)."""
    family: str | None = tag("family")
    backend: str | None = tag("backend")
    device: str | None = tag("device")
    precision: str | None = tag("precision")
    compile: str | None = tag("compile")
    cuda_graph: bool | None = tag("cuda_graph")
    monitor: str | None = tag("monitor")
    monitor_mode: str | None = tag("monitor_mode")
    torch_version: str | None = tag("torch")
    lightning_version: str | None = tag("lightning")
    mlx_version: str | None = tag("mlx")
    git_commit: str | None = tag("git_commit")
    platform_machine: str | None = tag("platform.machine")
    rosetta: bool | None = tag("rosetta")
    mps_fallback: bool | None = tag("mps_fallback")
    presets: Mapping[str, str] | None = tags_named("preset.{group}")
    timing_clock: str | None = tag("timing.clock")  # "device" (CUDA events) | "host" (after a device sync)
    sync_check: str | None = tag("timing.sync_check")  # "agrees" | "unsynchronised" (host-clocked runs)

    """Its place in a study (the sweeplab sweeper's jobs): the configuration (its swept overrides), its index in the
    grid (0: the default baseline), the replicate (0-based: seed = seed + replicate), the round it ran in, its seed,
    host, how many jobs of the sweep ran beside it, the GPU id(s) it ran on, the sweep's name, Hydra's job number
    (from 0), the objective's metric name and direction, the CUDA_VISIBLE_DEVICES it had."""
    config: str | None = tag("config")
    config_index: int | None = tag("config_index")
    replicate: int | None = tag("replicate")
    round: int | None = tag("round")
    seed: int | None = tag("seed")
    host: str | None = tag("host")
    concurrent_jobs: int | None = tag("concurrent_jobs")
    gpu: str | None = tag("gpu")
    sweep_id: str | None = tag("sweep_id")
    hydra_job: str | None = tag("hydra_job")
    objective_metric: str | None = tag("objective")
    objective_mode: str | None = tag("objective_mode")
    cuda_visible_devices: str | None = tag("cuda_visible_devices")

    """Packed on a GPU (hydra/launcher=joblib_gpus, sweeplab.sweep.packing): how many jobs ran side by side on each
    GPU, its configuration's step time alone as the launcher's probe measured it (s), and the lane that ran it
    (`<GPU slot>:<worker pid>`: the report's lanes timeline)."""
    lanes_per_gpu: int | None = tag("lanes_per_gpu")
    solo_step_time_s: float | None = tag("solo_step_time_s")
    lane: str | None = tag("lane")

    """Under SLURM: the job's id as sacct and scancel take it (`<array id>_<index>`), its index in the array, how
    many times SLURM ran it again into this run, and how the scheduler ended it before it could end itself
    ("CANCELLED: ..."; moved to `previous_error` when a continued study resumes the run)."""
    slurm_job_id: str | None = tag("slurm_job_id")
    slurm_array_index: str | None = tag("slurm_array_index")
    slurm_restarts: int | None = tag("slurm_restarts")
    slurm_end: str | None = tag("slurm_end")

    """Its course and fate: its output directory, the best checkpoint's path (set when it ends), the config hashes
    `resume=true` finds it by, the checkpoint a resumed run continued from, the finished run it extends, the changes
    a resume made (`old -> new (from step N)` per key), what went non-finite (guard.mode=off), why it stopped early
    (stop.*: "target" | "behind" | "no_improvement") after how many optimizer steps, the batch size found by
    tune.batch_size, the samples each batch really held (a training split smaller than data.batch_size), why it
    FAILED or was KILLED (one line), and the previous attempt's reason on a resumed run."""
    output_dir: str | None = tag("output_dir")
    checkpoint: str | None = tag("checkpoint")
    config_hash: str | None = tag("sweeplab.config_hash")
    resumable_hash: str | None = tag("sweeplab.resumable_hash")  # config_hash without what a resume may change
    resumed_from: str | None = tag("resumed_from")
    extends: str | None = tag("extends")
    changed_on_resume: Mapping[str, str] | None = tags_named("changed_on_resume.{key}")
    diverged: str | None = tag("diverged")
    stop_reason: str | None = tag("stop_reason")
    stop_step: int | None = tag("stop_step")
    tuned_batch_size: int | None = tag("tuned.batch_size")
    batch_size_used: int | None = tag("data.batch_size_used")
    error: str | None = tag("error")
    previous_error: str | None = tag("previous_error")

    """Its line in the sweep's spread view (sweeplab.report.saved_view; a replicated sweep's report writes both): its
    configuration's short label, which the view selects its runs by, and that configuration's colour (the UI reads
    the tag), so the replicates of one configuration draw in one colour."""
    spread_line: str | None = tag("sweeplab.spread_line")
    color: str | None = tag("mlflow.runColor")

    """Params: the resolved config flattened to dotted keys (every key; values as strings, at most 6000 characters),
    and the ones the study reads by name."""
    config_params: Mapping[str, str] | None = params_named("{key}")
    batch_size: int | None = param("data.batch_size")
    accumulate_grad_batches: int | None = param("trainer.accumulate_grad_batches")
    devices: int | None = param("trainer.devices")
    max_steps: int | None = param("trainer.max_steps")
    data_seed: int | None = param("data.seed")

    """Per timing window (`timing.window` optimizer steps), at its last step: window wall time / its optimizer steps
    (s), samples and tokens per second over it, model FLOPs / window time / the device's peak (fraction)."""
    window_step_time: float | None = metric("train/step_time_s")
    window_samples_per_sec: float | None = metric("train/samples_per_sec")
    window_tokens_per_sec: float | None = metric("train/tokens_per_sec")
    window_mfu: float | None = metric("train/mfu")

    """The run summary (written once when training ends; the timed steps only): median window step time (s) and its
    p10/p90, (p90 - p10) / median (fraction), throughput (samples/s, tokens/s; all timed samples / all timed
    seconds), samples per optimizer step, model FLOPs utilisation (fraction), peak memory (MiB), timed steps and
    seconds, DDP processes."""
    step_time_median: float | None = metric("summary/step_time_s_median")
    step_time_p10: float | None = metric("summary/step_time_s_p10")
    step_time_p90: float | None = metric("summary/step_time_s_p90")
    step_time_spread: float | None = metric("summary/step_time_spread")
    samples_per_sec: float | None = metric("summary/samples_per_sec")
    samples_per_sec_overall: float | None = metric("summary/samples_per_sec_overall")
    samples_per_step: float | None = metric("summary/samples_per_step")
    tokens_per_sec: float | None = metric("summary/tokens_per_sec")
    mfu: float | None = metric("summary/mfu")
    peak_mem_mb: float | None = metric("summary/peak_mem_mb")
    timed_steps: float | None = metric("summary/timed_steps")
    timed_seconds: float | None = metric("summary/timed_seconds")
    world_size: float | None = metric("summary/world_size")
    samples_per_sec_per_device: float | None = metric("summary/samples_per_sec_per_device")
    samples_per_sec_overall_per_device: float | None = metric("summary/samples_per_sec_overall_per_device")
    tokens_per_sec_per_device: float | None = metric("summary/tokens_per_sec_per_device")
    samples_per_step_per_device: float | None = metric("summary/samples_per_step_per_device")
    num_parameters: float | None = metric("summary/num_parameters")
    trainable_parameters: float | None = metric("summary/trainable_parameters")

    """How far its timing can be trusted (sweeplab.core.stability): distinct batch shapes, shapes and compilations
    first met inside timed steps (should be 0), MPS driver growth (MiB), the timer's time / the host's readback time
    (fraction), the host's load average at start and end, its pure-Python speed spread (fraction), CPUs it may run
    on, torch's intra-op threads."""
    batch_shapes: float | None = metric("summary/batch_shapes")
    new_shapes_in_timed_steps: float | None = metric("summary/new_shapes_in_timed_steps")
    compiles_in_timed_steps: float | None = metric("summary/compiles_in_timed_steps")
    mps_driver_growth_mb: float | None = metric("summary/mps_driver_growth_mb")
    timer_readback_ratio: float | None = metric("summary/timer_readback_ratio")
    load_avg_start: float | None = metric("summary/load_avg_start")
    load_avg_end: float | None = metric("summary/load_avg_end")
    host_speed_spread: float | None = metric("summary/host_speed_spread")
    host_cpus: float | None = metric("summary/host_cpus")
    cpu_threads: float | None = metric("summary/cpu_threads")

    """Where its wall time went (s, step 0; sweeplab.core.wall: disjoint parts summing to the job's wall time, the
    set-up in segments summing to it), and what compilation found in inductor's caches (counts; compile != off)."""
    wall_breakdown: Mapping[str, float] | None = metrics_named("summary/wall_breakdown/{part}_s")
    setup_split: Mapping[str, float] | None = metrics_named("summary/setup_split/{segment}_s")
    compile_cache: Mapping[str, float] | None = metrics_named("summary/compile_cache/{counter}")

    """With `timing=profile`: each phase's ms per step and share of the step time (fraction; data_loading, forward,
    backward, optimizer, framework, graph_step)."""
    profile_ms: Mapping[str, float] | None = metrics_named("profile/{phase}_ms")
    profile_share: Mapping[str, float] | None = metrics_named("profile/{phase}_share")

    """The sweep's record of it: the job's return value, the value its sweeper gets (the best monitored metric)."""
    objective: float | None = metric("objective")

    """Other stages: a bench job's row and repeat, its hand-written loop's throughput (samples/s) and step time (s),
    and the job's samples/s / the loop's; after an export, per variant, the readiness verdict (tag) and figures."""
    bench_row: str | None = tag("bench.row")
    bench_repeat: int | None = tag("bench.repeat")
    bench_raw_samples_per_sec: float | None = metric("bench/raw_samples_per_sec")
    bench_raw_step_time: float | None = metric("bench/raw_step_time_s")
    bench_overhead: float | None = metric("bench/overhead")
    export_verdicts: Mapping[str, str] | None = tags_named("export/{variant}/ane_verdict")
    export_figures: Mapping[tuple[str, str], float] | None = metrics_named("export/{variant}/{figure}")


# --- the sweep run: one per sweep, the parent of its jobs ------------------------------------------------------------


@dataclass(frozen=True)
class SweepRun(_Record):
    """A sweep's parent run (sweeplab.sweep.callback opens it; the bench's runs are sweep runs too)."""

    """Identity: role "sweep", its name (`sweep <sweep_id>`), the sweep's one name (its folder's last two parts)
    and folder, the launcher and sweeper chosen, the overrides it ran with, the command that continues it (launcher
    settings included), its description (the `-m` command; once reported, the verdict's lines first), the packages
    whose sources its Python compiled at its start, how many times it was continued, the bench's command."""
    role: str | None = tag("sweeplab.role")
    name: str | None = tag("mlflow.runName")
    sweep_id: str | None = tag("sweep_id")
    sweep_dir: str | None = tag("sweep_dir")
    launcher: str | None = tag("launcher")
    sweeper: str | None = tag("sweeper")
    sweep_overrides: str | None = tag("sweep_overrides")
    continue_command: str | None = tag("continue_command")
    description: str | None = tag("mlflow.note.content")
    uncached_bytecode: str | None = tag("sweep/uncached_bytecode")
    resumed: int | None = tag("resumed")
    bench_command: str | None = tag("bench.command")

    """What it asked of its verdict (`python -m sweeplab.report` asks the same unless its flags say otherwise): the
    target in the metric's units, the quality tolerance, the indifference ratio (>= 1), and the looks replicates=auto
    may take at its verdict (`first-most` rounds)."""
    target: float | None = tag("report.target")
    quality_tolerance: float | None = tag("report.quality_tolerance")
    indifference: float | None = tag("report.indifference")
    looks: str | None = tag("report.looks")

    """Params: each swept key's values as given (`sweep.<key>`), the best job's value of every key that differs
    between jobs (`best.<key>`)."""
    swept: Mapping[str, str] | None = params_named("sweep.{key}")
    best_params: Mapping[str, str] | None = params_named("best.{key}")

    """The jobs (counts): planned by the sweeper, ended FINISHED, FAILED, KILLED, never started; the failed jobs
    (tag), the jobs the scheduler ended (`job 2 (scheduler job 41_2): CANCELLED; ...`), the jobs submitted and left
    running (hydra.sweeper.leave=true) and where they are recorded, why the sweep itself failed (one line); what
    those three said before the study was continued (`earlier`: `key: value` entries, `; `-joined, oldest first;
    a continue clears them, so a study continued to its end reads FINISHED without them)."""
    jobs_planned: int | None = metric("jobs_planned")
    jobs_done: int | None = metric("jobs_done")
    jobs_failed: int | None = metric("jobs_failed")
    jobs_killed: int | None = metric("jobs_killed")
    jobs_not_run: int | None = metric("jobs_not_run")
    failed_jobs: int | None = tag("failed_jobs")
    lost_jobs: str | None = tag("lost_jobs")
    left_jobs: str | None = tag("left_jobs")
    error: str | None = tag("error")
    earlier: str | None = tag("earlier")

    """Its process (s): from its start (interpreter and imports included) to its report, and when it started (Unix
    seconds): a continued sweep's report sets its wall against the jobs that process ran."""
    process_wall_s: float | None = metric("sweep/process_wall_s")
    process_start_s: float | None = metric("sweep/process_start_s")

    """The best: the best job's run id, name and Hydra job number, the objective's metric name and direction
    ("max" | "min"), its value (metric); with replicates the verdict's kind (fastest | tie | no verdict) and the
    configuration (the tied ones joined by " | "), and the study's caveats in a few words."""
    best_run_id: str | None = tag("best_run_id")
    best_run_name: str | None = tag("best_run_name")
    best_job: str | None = tag("best_job")
    objective_metric: str | None = tag("objective")
    objective_mode: str | None = tag("objective_mode")
    best_objective: float | None = metric("best/objective")
    best_verdict: str | None = tag("best_verdict")
    best_config: str | None = tag("best_config")
    caveats: str | None = tag("caveats")


# --- the configuration run: one per configuration of a replicated sweep ---------------------------------------------


@dataclass(frozen=True)
class ConfigurationRun(_Record):
    """A configuration's aggregates, nested under its sweep's run (sweeplab.report.config_runs writes it)."""

    """Identity: role "configuration", its name (the configuration's short label), the sweep's run, the
    configuration (its jobs' `config` tag), its description, its jobs' run ids (comma-separated), the sweep's name
    and folder; its swept keys as params (the jobs' param names, so the compare view lines them up)."""
    role: str | None = tag("sweeplab.role")
    name: str | None = tag("mlflow.runName")
    parent_run_id: str | None = tag("mlflow.parentRunId")
    config: str | None = tag("config")
    description: str | None = tag("mlflow.note.content")
    job_run_ids: str | None = tag("job_run_ids")
    sweep_id: str | None = tag("sweep_id")
    sweep_dir: str | None = tag("sweep_dir")
    swept_values: Mapping[str, str] | None = params_named("{key}")

    """Its standing: quality (keeps | unclear | loses | baseline | unknown | at target), the verdict in words
    (fastest | fastest (or within 1.1x) | tied for fastest | left out | undetermined | no verdict), the target as
    text (`val/cos ≥ 0.5364`) and value (metric), the saved view's sort key (verdict group, place, label), whether
    it is the baseline, the study's caveats in a few words ("none"), the stability of its speed, the monitored
    metric and its direction."""
    quality: str | None = tag("quality")
    verdict: str | None = tag("verdict")
    target_text: str | None = tag("target")
    verdict_order: str | None = tag("sweeplab.verdict_order")
    baseline: bool | None = tag("baseline")
    caveat: str | None = tag("caveat")
    stability: str | None = tag("stability")
    objective_metric: str | None = tag("objective")
    objective_mode: str | None = tag("objective_mode")
    # its colour in MLflow's charts (the UI reads this tag), the report figures' colour of the configuration
    color: str | None = tag("mlflow.runColor")
    # the target's run only: its line in the spread view beside the jobs' (JobRun.spread_line), "target"
    spread_line: str | None = tag("sweeplab.spread_line")

    """Its figures (sweeplab.study.verdict.FIGURES): jobs and jobs that reached the target (counts); each figure's
    median, ratio or difference with `_low` / `_high` bounds as metrics (`samples_per_sec`, `speedup_to_target`,
    `final_val_cos`, ...), and as `median (low–high)` text tags named as report.csv names them; the chart's median
    validation curve against training seconds (the target's line: a run of its own, role target)."""
    # the figures first: MLflow's compare view opens its parallel-coordinates plot on the first metric a run logged,
    # which must differ between the configurations (the target and the job count do not)
    figures: Mapping[str, float] | None = metrics_named("{figure}")
    figure_texts: Mapping[str, str] | None = tags_named("{figure}")
    jobs: int | None = metric("jobs")
    reached_target: int | None = metric("reached_target")
    target: float | None = metric("target")  # the standing's target as a value (target_text: as text)
    curve: Mapping[str, float] | None = metrics_named("median {metric}")  # a history: one value per shared validation
    # its x axis (a history beside it); the target line's run (role target) holds the target under the curve's key
    curve_seconds: float | None = metric("training seconds")


def merged(*parts: Any) -> Any:
    """One record holding the fields each of `parts` (records of one class) set; a later part's value wins."""
    values: dict[str, Any] = {}
    for part in parts:
        values |= {f.name: getattr(part, f.name) for f in dataclasses.fields(part) if getattr(part, f.name) is not None}
    return type(parts[0])(**values)


JOB, SWEEP, CONFIGURATION = Keys(JobRun), Keys(SweepRun), Keys(ConfigurationRun)
RECORDS = (JobRun, SweepRun, ConfigurationRun)

# Keys that are plain words other vocabularies spell too: a literal of one of these outside this module names that
# other thing, never the run's key (tests/test_sweep_record.py holds every literal of them to that: none is a key of
# a run's tags, params or metrics there). The config keys among them name the config value the tag records.
SHARED_SPELLINGS = {
    "backend": "the config group (backend.name) and a checkpoint's `sweeplab.backend`; a report column",
    "baseline": "a configuration's quality (`baseline`), the report's wording",
    "caveat": "report.html's class of a caveat line",
    "checkpoint": "the config group (checkpoint.*), and the export report's source field",
    "compile": "the config key (torch.compile's mode) and its error messages; a bench column",
    "config": "a task's hyperparameter group and a table column",
    "cuda_graph": "the config key and its error messages; a bench column",
    "device": "a timer's clock (CUDA events), an ANE placement's field; a bench column",
    "error": "an export check's failure field",
    "family": "the config key model.family, a checkpoint's hyperparameter, the export report's source field",
    "gpu": "MLX's GPU device, Core ML's GPU compute unit",
    "host": "a timer's clock (the host's), the verdict's pairing by host, the bench's environment",
    "lanes_per_gpu": "the GPU lanes launcher's option (hydra.launcher.lanes_per_gpu) the tag records",
    "jobs": "the bench's jobs folder, report.html's id, the configuration table's column",
    "lightning": "the library's module and logger names",
    "mlx": "the backend of that name and a checkpoint's MLX section",
    "monitor": "Lightning's checkpoint callback state field",
    "objective": "the objective plot's axis label",
    "precision": "the export option and a bench column",
    "quality": "the report's and the verdict's quality column",
    "round": "the verdict's pairing by round",
    "seed": "the config key (the seed the tag records) and its overrides",
    "stability": "the order check's column",
    "sweep_dir": "the lanes' probe request's field (the folder the probe's jobs share their compile cache in)",
    "target": "the config key report.target, a stop rule's reason, the data's `target` field",
    "torch": "the library's module name and a model's init mode",
    "trainer.max_steps": "the config key the param records, read by the lanes' probe to size itself",
    "verdict": "the export's readiness verdict field and the order check's column",
}


def all_keys() -> set[str]:
    """Every key a record declares (templates left out: they are patterns, not keys)."""
    return {key for keys in (JOB, SWEEP, CONFIGURATION) for key in keys if "{" not in key}
