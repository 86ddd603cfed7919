"""`make bench`: the paGating M4 table (CPU baseline, accelerator basic, accelerator optimised, for each model) on
whatever hardware is here, each row also run as a careful hand-written PyTorch loop in the same process.

    python -m sweeplab.bench [experiment=bench] [bench.repeats=3] [bench.only=TextBridge] [any train override]

Each row is one sweeplab job (`training.train`, MLflow run and all) and a raw loop of the same model, data, batch,
optimizer, gradient clipping, precision and compile setting, run alternately (A B B A ...) so machine noise hits
both. `overhead = sweeplab samples/s / raw-loop samples/s` (1.0: no cost; 0.97: sweeplab costs 3 %).
Both sides exclude the same warm-up steps and synchronise the device at the edges of the timed stretch; both
include data loading. Results: bench.md and bench.csv under reports/bench/<time>/, a parent MLflow run holding
them, and one child run per sweeplab job with `bench/raw_samples_per_sec` and `bench/overhead` added.

TextBridge's teacher targets are pre-computed in the dataset files (EFB1/JSONL `target`), so no row ever runs a
teacher: "pre-cached teacher targets" is how TextBridge always trains here. For batches larger than a family's demo
data allows, `bench.data_samples` asks each row's family for more (`Family.bench_data`: TextBridge tiles its demo
set's records into a larger EFB1 file).
"""

from __future__ import annotations

import contextlib
import copy
import datetime as dt
import logging
import os
import re
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf, open_dict

from sweeplab.core import cli, stability
from sweeplab.core.config import build
from sweeplab.core.console import quiet_libraries
from sweeplab.core.errors import UserError, exit_on_user_error
from sweeplab.core.files import write_text_atomic
from sweeplab.core.records import JOB, SWEEP_ROLE, JobRun, SweepRun
from sweeplab.families import get_family, missing_config_hint, resolve
from sweeplab.report.tables import format_number, to_csv, to_markdown
from sweeplab.tracking import mlflow_store, naming, runs

if TYPE_CHECKING:
    import torch


# torch, Lightning and the engine are imported where a row runs, not here: a misspelt override fails in a second,
# before they load (issue 38)

log = logging.getLogger("sweeplab.bench")


# --- what a bench is ---------------------------------------------------------------------------------
@dataclass
class BenchRow:
    name: str
    overrides: list[str]
    role: str = "accelerator"  # cpu (the speedup baseline of its model) | accelerator (skipped without one)
    warmup_steps: int | None = None  # None: the bench's
    steps: int | None = None
    repeats: int | None = None


@dataclass
class BenchSettings:
    rows: list  # of BenchRow keyword mappings
    experiment_name: str = "sweeplab-bench"
    warmup_steps: int = 5  # untimed steps before each timed stretch (compilation, allocator growth)
    steps: int = 40  # timed optimizer steps per run
    repeats: int = 2  # sweeplab/raw pairs per row, alternating order
    limit_val_batches: int = 2  # the one validation at the end of each sweeplab job (never timed)
    data_samples: int = 0  # >0: rows whose family has bench data (Family.bench_data) train on this many samples
    only: str = ""  # comma-separated: run only rows whose name contains one of these
    # one untimed raw-loop run per row first, so neither side's first timed run pays first-time costs: compile
    # caches, page cache, cuDNN autotuning, and on a CPU oneDNN's kernels for each new shape (TextBridge batches
    # vary in width): without it the CPU rows' first sweeplab run timed 10-15 % slower than its later runs
    burn_in: bool = True

    def __post_init__(self) -> None:
        if self.steps < 1 or self.repeats < 1 or self.warmup_steps < 0:
            raise ValueError("bench: steps and repeats must be >= 1 and warmup_steps >= 0")
        self.rows = [r if isinstance(r, BenchRow) else build(BenchRow, r, f"bench.rows[{i}]") for i, r in enumerate(self.rows)]
        for row in self.rows:
            if row.role not in ("cpu", "accelerator"):
                raise ValueError(f"bench row {row.name!r}: role must be cpu or accelerator, got {row.role!r}")


def compose(overrides: list[str]) -> DictConfig:
    """The training config with `overrides`; a mistake in them raises a one-line UserError."""
    return cli.compose("train", overrides, hint=missing_config_hint)


def load_settings(argv: list[str]) -> tuple[BenchSettings, list[str], list[str]]:
    """(settings, the experiment override, overrides for every row) from `experiment=... bench.k=v k=v` args."""
    experiment = next((a for a in argv if a.startswith("experiment=")), "experiment=bench")
    only = [a.partition("=")[2] for a in argv if a.startswith("bench.only=")]  # commas are Hydra sweep syntax
    bench_args = [a for a in argv if a.startswith("bench.") and not a.startswith("bench.only=")]
    row_args = [a for a in argv if not a.startswith(("bench.", "experiment="))]
    cfg = compose([experiment, *bench_args])
    if "bench" not in cfg:
        raise UserError(f"{experiment} has no `bench:` section; use experiment=bench or experiment=bench_h100")
    values = OmegaConf.to_container(cfg.bench, resolve=True)
    if only:
        values["only"] = only[-1].strip("'\"")

    return build(BenchSettings, values, "bench"), [experiment], row_args


# --- the raw loop --------------------------------------------------------------------------------------
def _precision_context(precision: str, device: torch.device):
    import torch

    from sweeplab.tasks.step_graph import autocast_dtype

    dtype = autocast_dtype(precision)
    return torch.autocast(device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext()


class RawLoop:
    """The job's model trained by hand: to(device) -> zero_grad -> autocast forward + loss -> backward ->
    clip_grad_norm_ -> optimizer step -> LR schedule step. Built from the same plan as the sweeplab job: same
    model config and init seed, same batches (DataLoader or device-resident, batch size, workers, pinned memory,
    shuffling seed), same optimizer (fused/foreach as configured), schedule, clipping, precision, compile mode (of
    the forward + loss function, as sweeplab compiles it) and, with cuda_graph=true, the same capture of forward,
    backward and clipping (tasks/step_graph.py: plain torch.cuda.graph, no Lightning in it); with
    steps_per_batch=k, the same k whole optimizer steps per batch (MultiStepGraph, one replay under cuda_graph), so
    the ratio compares like with like."""

    def __init__(self, cfg: DictConfig):
        import lightning as L
        import torch

        from sweeplab.engine.lightning_fit import fresh_compiler
        from sweeplab.engine.plan import plan
        from sweeplab.families import check_task
        from sweeplab.runtime import backends
        from sweeplab.tasks.base import compile_regions
        from sweeplab.tasks.optim import build_optimizer, build_scheduler
        from sweeplab.tasks.step_graph import MultiStepGraph, StepGraph, autocast_dtype, capturable_update

        p = plan(cfg)
        backends.apply_backend_settings(p.backend_config, p.backend)
        L.seed_everything(cfg.seed, workers=True, verbose=False)
        self.device = torch.device("cuda", torch.cuda.current_device()) if p.backend == "cuda" else torch.device(p.backend)
        self.datamodule = p.datamodule
        self.datamodule.device = self.device  # where device-resident batches (data.on_device) live
        self.datamodule.prepare_data()
        self.datamodule.setup("fit")
        model_config = p.family.fitted_model_config(p.model_config, self.datamodule, p.model_values)
        task = p.family.make_task(model_config, p.loss_config, p.optim)
        check_task(p.family, task)  # what the sweeplab job checks of it
        self.precision = p.trainer.precision
        self.model = task.model.to(self.device)
        if self.precision == "bf16-true":
            self.model = self.model.to(torch.bfloat16)
        self.model.train()
        self.samples_in = task.samples_in
        # the family's training loss, plain torch by the SweepTask contract: the same arithmetic the Lightning job
        # runs, called directly (no Lightning hook, logging or closure around it)
        self.task = task

        def loss_fn(batch):
            return task.training_loss(batch)[0], {}

        if p.compile_mode != "off":
            fresh_compiler()  # as each sweeplab job does: no shapes remembered from earlier rows
            mode = None if p.compile_mode == "default" else p.compile_mode
            if p.compile_scope == "regions":  # the model's regions, compiled in place; the loss function stays eager
                compile_regions(self.model, mode, task.compile_dynamic)
            else:
                loss_fn = torch.compile(loss_fn, mode=mode, dynamic=task.compile_dynamic)
        self.loss_fn = loss_fn
        self.steps_per_batch = p.steps_per_batch  # optimizer steps per batch (the datamodule groups k batches' rows)
        capturable = capturable_update(p.cuda_graph, p.steps_per_batch, self.device)
        self.optimizer = build_optimizer(self.model, p.optim, capturable=capturable)
        self.scheduler = build_scheduler(self.optimizer, p.optim, p.trainer.max_steps)
        self.params = [p_ for group in self.optimizer.param_groups for p_ in group["params"]]
        self.grad_clip = p.optim.grad_clip
        self.scaler = torch.amp.GradScaler(self.device.type) if self.precision == "16-mixed" else None
        self.step_graph = (
            StepGraph(loss_fn, self.params, self.grad_clip, autocast_dtype(self.precision), self.device)
            if p.cuda_graph and p.steps_per_batch == 1
            else None
        )
        self._new_multi_step_graph = lambda: (
            MultiStepGraph(loss_fn, self.optimizer, p.steps_per_batch, self.grad_clip, autocast_dtype(self.precision),
                           self.device, capture=p.cuda_graph)
            if p.steps_per_batch > 1
            else None
        )
        self.multi_step_graph = self._new_multi_step_graph()
        self.step_count = 0
        self.loader = self.datamodule.train_dataloader()
        self.seed = int(cfg.seed)
        self._initial = {  # what every run starts from (reset); weights kept on the host, off the device's memory
            "model": {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()},
            "optimizer": copy.deepcopy(self.optimizer.state_dict()),
            "scheduler": copy.deepcopy(self.scheduler.state_dict()),
        }

    def reset(self) -> None:
        """Back to where a sweeplab job starts: the initial weights, no optimizer state, the schedule's first step,
        the first batch of the first epoch, the same random state. Every timed run then does exactly one job's work
        whatever ran before it; without this the loop trained on from run to run, on later batches (TextBridge
        batches differ in width, so in work) than the job it was compared with."""
        import lightning as L

        from sweeplab.data.sampling import ResumableShuffleBatchSampler

        L.seed_everything(self.seed, workers=True, verbose=False)
        self.model.load_state_dict(self._initial["model"])
        self.optimizer.load_state_dict(self._initial["optimizer"])  # also the groups' initial learning rates
        # a graph of whole steps updates the optimizer state it was captured with, which the load replaced: capture
        # again in this run's warm-up, as each sweeplab job does
        self.multi_step_graph = self._new_multi_step_graph()
        self.scheduler.load_state_dict(self._initial["scheduler"])
        self.step_count = 0
        sampler = getattr(self.loader, "batch_sampler", None)
        if isinstance(sampler, ResumableShuffleBatchSampler):
            sampler.load_state_dict({"epoch": 0, "batches_yielded": 0})

    def _to_device(self, batch: dict) -> dict:
        # non-blocking to CUDA only, as Lightning copies (MPS blocks: pytorch#83015)
        from sweeplab.runtime import devices

        moved = {k: devices.to_device(v, self.device) for k, v in batch.items()}
        if self.precision == "bf16-true":
            moved = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in moved.items()}
        return moved

    def step(self, batch: dict) -> None:
        """One batch: one optimizer step, or `steps_per_batch` of them (one graph replay under cuda_graph)."""
        import torch

        from sweeplab.tasks.step_graph import scheduled_lrs

        batch = self._to_device(batch)
        if self.multi_step_graph is not None:
            self.multi_step_graph(batch, scheduled_lrs(self.optimizer, self.scheduler, self.steps_per_batch))
            for _ in range(self.steps_per_batch):
                self.scheduler.step()
            self.step_count += self.steps_per_batch
            return
        self.task.set_training_step(self.step_count)
        if self.step_graph is not None:
            self.step_graph(batch)  # forward, backward, clipping (replayed after its warm-up)
            self.optimizer.step()
        else:
            self.optimizer.zero_grad(set_to_none=True)
            with _precision_context(self.precision, self.device):
                loss = self.loss_fn(batch)[0]
            if self.scaler is not None:
                self.scaler.scale(loss).backward()
                self.scaler.unscale_(self.optimizer)
                if self.grad_clip:
                    torch.nn.utils.clip_grad_norm_(self.params, self.grad_clip)
                self.scaler.step(self.optimizer)
                self.scaler.update()
            else:
                loss.backward()
                if self.grad_clip:
                    torch.nn.utils.clip_grad_norm_(self.params, self.grad_clip)
                self.optimizer.step()
        self.scheduler.step()
        self.step_count += 1

    def run(self, warmup_steps: int, steps: int, clock: Callable[[], float] = time.perf_counter) -> dict[str, float]:
        """From the initial state (reset), warm up, then time `steps` steps (data loading included) between two
        device syncs."""
        from sweeplab.callbacks.timing import compiled_graphs
        from sweeplab.runtime import devices

        self.reset()
        batches = iter(self.loader)  # a fresh pass, as each Lightning fit starts one

        def next_batch():
            nonlocal batches
            try:
                return next(batches)
            except StopIteration:  # epoch boundary: a new pass over the data, as Lightning does
                batches = iter(self.loader)
                return next(batches)

        devices.synchronize(self.device)
        warmup_start = clock()
        for _ in range(warmup_steps // self.steps_per_batch):  # batches of steps_per_batch optimizer steps each
            self.step(next_batch())
        devices.synchronize(self.device)
        t0, graphs = clock(), compiled_graphs()
        samples = 0
        for _ in range(steps // self.steps_per_batch):
            batch = next_batch()
            samples += self.samples_in(batch)
            self.step(batch)
        devices.synchronize(self.device)
        elapsed = clock() - t0
        self.optimizer.zero_grad(set_to_none=True)
        return {"samples_per_sec": samples / elapsed, "step_time_s": elapsed / steps, "samples": samples,
                "compiles": compiled_graphs() - graphs, "warmup_s": t0 - warmup_start}


# --- one row: sweeplab and the raw loop, alternating ----------------------------------------------------
def sweeplab_rate(metrics: dict[str, float]) -> float | None:
    """A job's samples/s as the raw loop measures its own: all timed samples over all timed seconds (the job's
    headline `summary/samples_per_sec` is at its median window, which a single stopwatch stretch does not have)."""
    return metrics.get(JOB.samples_per_sec_overall) or metrics.get(JOB.samples_per_sec)


@dataclass
class RowResult:
    row: BenchRow
    cfg: DictConfig | None = None
    sweeplab: list[dict[str, float]] = field(default_factory=list)  # MLflow summaries
    raw: list[dict[str, float]] = field(default_factory=list)
    run_ids: list[str] = field(default_factory=list)
    skipped: str = ""
    failed: str = ""
    # the raw loop's first warm-up (its burn-in) less its steps at the timed rate: torch.compile's time for this
    # configuration in a fresh process's compiler (autotuning included); None when nothing compiles
    compile_s: float | None = None

    def median(self, side: str, key: str) -> float | None:
        values = [r[key] for r in getattr(self, side) if r.get(key) is not None]
        return statistics.median(values) if values else None

    @property
    def sweeplab_rate(self) -> float | None:
        values = [rate for m in self.sweeplab if (rate := sweeplab_rate(m))]
        return statistics.median(values) if values else None

    @property
    def overhead(self) -> float | None:
        ours, raw = self.sweeplab_rate, self.median("raw", "samples_per_sec")
        return ours / raw if ours and raw else None

    @property
    def pair_overheads(self) -> list[float]:
        return [sweeplab_rate(s) / r["samples_per_sec"] for s, r in zip(self.sweeplab, self.raw)]


def row_config(
    row: BenchRow, settings: BenchSettings, experiment: list[str], row_args: list[str], data_root: Path | None = None
) -> DictConfig:
    """A row's job config; with `bench.data_samples`, the data keys its family's `bench_data` sets, the data written
    under `data_root` (None: <paths.data_dir>/bench)."""
    warmup = settings.warmup_steps if row.warmup_steps is None else row.warmup_steps
    steps = settings.steps if row.steps is None else row.steps
    max_steps = warmup + steps
    bench_overrides = [
        f"trainer.max_steps={max_steps}",
        f"trainer.val_check_interval={max_steps}",  # one validation, after the last timed step
        f"trainer.limit_val_batches={settings.limit_val_batches}",
        f"timing.warmup_steps={warmup}",
        f"timing.window={min(20, steps)}",
        f"logger.experiment_name={settings.experiment_name}",
        "trainer.enable_progress_bar=false",  # the bench prints one line per run (trainer.enable_progress_bar=true wins)
    ]
    cfg = compose([*experiment, *row.overrides, *bench_overrides, *row_args])
    with open_dict(cfg):
        cfg.pop("bench", None)
        if "checkpoint" in cfg and "every_n_steps" in cfg.checkpoint:
            cfg.checkpoint.every_n_steps = max_steps + 1  # periodic checkpoints are the user's cadence, not per step
            cfg.checkpoint.every_n_seconds = None  # nor by time: none inside the bench's timed steps
        if settings.data_samples > 0 and (bench_data := get_family(cfg.model.family).bench_data) is not None:
            data = OmegaConf.to_container(cfg.data, resolve=True)
            out_dir = data_root or Path(cfg.paths.data_dir) / "bench"
            for key, value in resolve(bench_data, f"family {cfg.model.family}", "bench_data")(data, settings.data_samples, out_dir).items():
                cfg.data[key] = value
    return cfg


def _allow_recompiles(limit: int = 256) -> None:
    """Every job builds a new model; dynamo keeps one cache entry per model (and per shape regime) and silently
    falls back to eager past its limit (8), which would time the later runs uncompiled."""
    import torch

    config = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit", "accumulated_cache_size_limit"):
        if hasattr(config, name):
            setattr(config, name, max(getattr(config, name), limit))


def wanted(row: BenchRow, only: str) -> bool:
    names = [n.strip().lower() for n in only.split(",") if n.strip()]
    return not names or any(n in row.name.lower() for n in names)


def _run_started_since(uri: str, experiment_id: str, since_ms: int):
    """The newest run of the experiment started at or after `since_ms` (the job `train` just ran)."""
    run = runs.newest_run_since(uri, experiment_id, since_ms)
    if run is None:
        raise RuntimeError(f"the sweeplab job left no MLflow run in experiment {experiment_id} of {uri}")
    return run


def run_row(
    row: BenchRow, cfg: DictConfig, settings: BenchSettings, uri: str, parent_run_id: str, out_dir: Path | None = None
) -> RowResult:
    """Alternate sweeplab jobs and raw-loop runs of one configuration; each job's MLflow run becomes a child of
    the bench's parent run and gets the raw loop's numbers."""
    from sweeplab.engine.training import train
    from sweeplab.runtime import devices

    result = RowResult(row, cfg)
    warmup, steps = int(cfg.timing.warmup_steps), int(cfg.trainer.max_steps) - int(cfg.timing.warmup_steps)
    raw_loop = RawLoop(cfg)
    experiment_id = runs.fetch(uri, parent_run_id).experiment_id
    _allow_recompiles()
    repeats = settings.repeats if row.repeats is None else row.repeats
    started = time.monotonic()

    def say(what: str) -> None:  # a line before each stretch: a row's runs take minutes, silence looks like a hang
        log.info("%s: %s (%.0f s into the row)", row.name, what, time.monotonic() - started)

    if settings.burn_in:
        say(f"burn-in: a raw-loop run of {warmup + steps} steps, untimed")
        burn_in = raw_loop.run(warmup, steps)  # untimed: the first pass over the data and the first compilation pay here
        if str(cfg.compile) != "off":
            result.compile_s = max(0.0, burn_in["warmup_s"] - warmup * burn_in["step_time_s"])
    for repeat in range(repeats):
        order = ("sweeplab", "raw") if repeat % 2 == 0 else ("raw", "sweeplab")
        for side in order:
            devices.release_earlier_jobs()
            say(f"pair {repeat + 1}/{repeats}: {'a sweeplab job' if side == 'sweeplab' else 'the raw loop'}, "
                f"{warmup + steps} steps")
            if side == "raw":
                result.raw.append(raw_loop.run(warmup, steps))
                log.info("%s raw loop %d: %.4g samples/s", row.name, repeat, result.raw[-1]["samples_per_sec"])
                continue
            started_ms = int(time.time() * 1000) - 1
            job_dir = out_dir / "jobs" / f"{re.sub(r'[^A-Za-z0-9]+', '_', row.name).strip('_')}-{repeat}" if out_dir else None
            train(cfg, output_dir=job_dir)  # each job's checkpoints of its own, beside the bench's tables
            run = _run_started_since(uri, experiment_id, started_ms)
            result.run_ids.append(run.run_id)
            result.sweeplab.append(dict(run.metrics))
            mlflow_store.write(uri, run.run_id, JobRun(parent_run_id=parent_run_id, bench_row=row.name,
                                                       bench_repeat=repeat))
            log.info("%s sweeplab %d: %.4g samples/s", row.name, repeat, sweeplab_rate(run.metrics) or 0)
    for run_id, ours, raw in zip(result.run_ids, result.sweeplab, result.raw):
        ours_rate = sweeplab_rate(ours)
        mlflow_store.write(uri, run_id, JobRun(
            bench_raw_samples_per_sec=raw["samples_per_sec"], bench_raw_step_time=raw["step_time_s"],
            bench_overhead=ours_rate / raw["samples_per_sec"] if ours_rate else None))
    del raw_loop
    devices.release_earlier_jobs()
    return result


# --- the table ----------------------------------------------------------------------------------------
COLUMNS = [
    "row", "model", "backend", "device", "batch", "precision", "compile", "compile (s)", "switches", "step (s)",
    "samples/s", "raw samples/s", "overhead", "pairs", "speedup", "tokens/s", "MFU", "peak mem (MB)", "final loss",
    "status",
]
SWITCHES = {
    "optim.implementation": lambda v: f"{v} optimizer" if v not in ("auto", None) else "",
    "data.pin_memory": lambda v: "pinned memory" if v else "",
    "model.gradient_checkpointing": lambda v: "grad checkpointing" if v else "",
    "data.num_workers": lambda v: f"{v} workers" if v else "",
    "data.on_device": lambda v: "batches on device" if v else "",
    "compile_scope": lambda v: "regional compile" if v == "regions" else "",
    "cuda_graph": lambda v: "CUDA graph" if v else "",
    "steps_per_batch": lambda v: f"{v} steps per batch" if v and v > 1 else "",
    "model.lm_loss": lambda v: f"{v} LM loss" if v not in ("full", None) else "",
    "model.attention": lambda v: f"{v} attention" if v not in ("auto", None) else "",
    "model.float8": lambda v: f"float8 {v}" if v not in ("none", None) else "",
}


def _select(cfg: DictConfig, key: str) -> Any:
    return OmegaConf.select(cfg, key, default=None)


def _compile_note(r: RowResult) -> str:
    """Compilations inside timed steps make a row's numbers wrong: the status says so, per side."""
    ours = sum(int(m.get(JOB.compiles_in_timed_steps, 0)) for m in r.sweeplab)
    raw = sum(int(m.get("compiles", 0)) for m in r.raw)
    return f"compiled during timing (sweeplab {ours}, raw {raw})" if ours or raw else ""


def _noise_note(pairs: list[float], spread: float = stability.NOISY_SPREAD) -> str:
    """Pairs further apart than `spread` of their median: the machine's noise is larger than a 3 % overhead. One pair
    gives no estimate of that noise, so its overhead is not called ok either."""
    if len(pairs) == 1:
        return "no noise estimate (1 pair): raise bench.repeats"
    if len(pairs) < 2:
        return ""
    width = (max(pairs) - min(pairs)) / statistics.median(pairs)
    return f"noisy: pairs {min(pairs):.2f}-{max(pairs):.2f}, raise bench.repeats" if width > spread else ""


def _stability_notes(r: RowResult) -> list[str]:
    """The report's rules (sweeplab.core.stability.problems) over the row's sweeplab jobs, which run between its raw-loop
    runs: a step-time spread, a loaded or unsteady host during any of them, new batch shapes in timed steps. One
    note per kind, from the first job it held for (compilations: _compile_note counts both sides)."""
    notes: dict[str, str] = {}
    for metrics in r.sweeplab:
        for problem in stability.problems(metrics):
            kind = problem.split(" (")[0]
            if not kind.endswith("compilation(s) in timed steps"):
                notes.setdefault(kind, problem)
    return list(notes.values())


def _status(r: RowResult) -> str:
    """ok only when nothing is known against the row's overhead: skipped, failed, or every reason it is unreliable."""
    if r.skipped or r.failed:
        return r.skipped or r.failed
    notes = [_compile_note(r), _noise_note(r.pair_overheads), *_stability_notes(r)]
    return "; ".join(n for n in notes if n) or "ok"


def table_rows(results: list[RowResult]) -> list[dict[str, str]]:
    from sweeplab.runtime import backends, devices

    baselines: dict[str, float] = {}
    for r in results:
        ours = r.sweeplab_rate
        if r.row.role == "cpu" and ours and r.cfg is not None:
            baselines.setdefault(str(r.cfg.model.family), ours)
    rows = []
    for r in results:
        cfg = r.cfg
        row = {"row": r.row.name}
        if cfg is not None:
            backend = backends.resolve_backend(cfg.backend.name) if not r.skipped else cfg.backend.name
            model = str(cfg.model.family) + (f" {cfg.model.size}" if _select(cfg, "model.size") else "")
            switches = [f(_select(cfg, k)) for k, f in SWITCHES.items()]
            row.update(
                model=model,
                backend=backend,
                device=devices.device_name(backend) if not r.skipped else "",
                batch=str(cfg.data.batch_size),
                precision=str(cfg.trainer.precision),
                compile=str(cfg.compile),
                switches=", ".join(s for s in switches if s),
            )
        ours = r.sweeplab_rate
        baseline = baselines.get(str(cfg.model.family)) if cfg is not None else None
        pairs = r.pair_overheads
        row.update(
            {
                "step (s)": format_number(r.median("sweeplab", JOB.step_time_median)),
                "samples/s": format_number(ours),
                "raw samples/s": format_number(r.median("raw", "samples_per_sec")),
                "overhead": format_number(r.overhead, 3),
                "pairs": " ".join(f"{x:.3f}" for x in pairs),
                "speedup": f"{ours / baseline:.2f}×" if ours and baseline else "",
                "tokens/s": format_number(r.median("sweeplab", JOB.tokens_per_sec)),
                "MFU": f"{mfu:.1%}" if (mfu := r.median("sweeplab", JOB.mfu)) else "",
                "peak mem (MB)": format_number(r.median("sweeplab", JOB.peak_mem_mb)),
                "compile (s)": format_number(r.compile_s),
                "final loss": format_number(r.median("sweeplab", "val/loss"), 4),
                "status": _status(r),
            }
        )
        rows.append(row)
    return rows


def environment() -> dict[str, str]:
    import platform

    import lightning
    import torch

    from sweeplab.runtime import devices

    env = {
        "date": dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "host": platform.node(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "lightning": lightning.__version__,
        "cpu": devices.device_name("cpu"),
        "cpu threads": str(torch.get_num_threads()),
        "load average": " ".join(f"{x:.1f}" for x in os.getloadavg()) + f" on {os.cpu_count()} cores",
        "git commit": mlflow_store.git_commit(),
    }
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name()
        env["cuda"] = str(torch.version.cuda)
    return env


def render(results: list[RowResult], settings: BenchSettings, command: str) -> str:
    env = environment()
    lines = [
        "## sweeplab bench",
        "",
        f"`{command}`",
        "",
        ", ".join(f"{k}: {v}" for k, v in env.items()),
        "",
        f"{settings.repeats} alternating sweeplab/raw-loop pairs per row; each run times the steps after its "
        f"warm-up, device synchronised at the edges, data loading included. overhead = sweeplab samples/s ÷ raw-loop "
        "samples/s (medians; `pairs` lists each pair's ratio); speedup = samples/s ÷ the model's CPU baseline row. "
        "compile (s): the raw loop's first warm-up less its steps at the timed rate (torch.compile in a fresh "
        "compiler, autotuning included). final loss: the sweeplab job's validation loss after its last step. "
        "status: ok, or why the overhead cannot be trusted: pairs further apart than "
        f"{stability.NOISY_SPREAD:.0%} (one pair: no noise estimate), compilations in timed steps, and the report's "
        "stability rules for the row's sweeplab jobs (step-time spread, host load, unsteady host).",
        "",
        to_markdown(table_rows(results), COLUMNS),
        "",
    ]
    return "\n".join(lines)


def write_tables(results: list[RowResult], settings: BenchSettings, command: str, out_dir: Path) -> str:
    markdown = render(results, settings, command)
    write_text_atomic(out_dir / "bench.md", markdown)
    write_text_atomic(out_dir / "bench.csv", to_csv(table_rows(results), COLUMNS))
    return markdown


# --- entry point ------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = cli.ArgumentParser(prog="python -m sweeplab.bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("overrides", nargs="*", help="experiment=bench|bench_h100, bench.KEY=VALUE, train overrides")
    parser.add_argument("--out", default=None, help="output directory (default: reports/bench/<time>)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s][%(name)s] %(message)s")
    quiet_libraries()
    try:
        settings, experiment, row_args = load_settings(args.overrides)
        chosen = [row for row in settings.rows if wanted(row, settings.only)]
        if not chosen:
            raise UserError(f"bench.only={settings.only} matches no row; rows: {', '.join(r.name for r in settings.rows)}")
        for row in chosen:  # a misspelt override fails now, not when its row comes
            compose([*experiment, *row.overrides, *row_args])
        out_dir = cli.check_writable(args.out or Path("reports") / "bench" / dt.datetime.now().strftime("%Y-%m-%d_%H-%M-%S"))
    except Exception as exc:
        exit_on_user_error(exc)
    command = "python -m sweeplab.bench " + " ".join(args.overrides)
    from sweeplab.runtime import backends, devices  # torch: once the overrides are known to compose


    has_accelerator = backends.resolve_backend("auto") != "cpu"
    uri = mlflow_store.resolve_uri(None)
    experiment_id = mlflow_store.init_store(uri, settings.experiment_name)
    parent_run_id = runs.create(uri, experiment_id, SweepRun(
        role=SWEEP_ROLE, name=naming.bench_run_name(out_dir), sweep_dir=str(out_dir), bench_command=command))

    results: list[RowResult] = []
    status = "FINISHED"
    try:
        for row in settings.rows:
            if not wanted(row, settings.only):
                continue
            cfg = row_config(row, settings, experiment, row_args)
            if row.role == "accelerator" and not has_accelerator:
                results.append(RowResult(row, cfg, skipped="skipped: no accelerator"))
                continue
            log.info("row %s: %s", row.name, " ".join(row.overrides))
            try:
                results.append(run_row(row, cfg, settings, uri, parent_run_id, out_dir))
            except Exception as exc:  # one broken row must not lose the others
                log.exception("row %s failed", row.name)
                results.append(RowResult(row, cfg, failed=f"FAILED: {type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}"))
                status = "FAILED"
            devices.release_earlier_jobs()
            write_tables(results, settings, command, out_dir)  # after every row: a cut-off run keeps what it had
        markdown = write_tables(results, settings, command, out_dir)
        runs.log_artifacts(uri, parent_run_id, [out_dir / "bench.md", out_dir / "bench.csv"], "report")
        print(markdown, flush=True)
        print(f"written: {out_dir / 'bench.md'}, {out_dir / 'bench.csv'}")
    finally:
        runs.end(uri, parent_run_id, status)
    return 0 if status == "FINISHED" else 1


if __name__ == "__main__":
    sys.exit(main())
