"""The lanes launcher's probe (sweeplab.sweep.packing): a few steps of each configuration of a study, alone on one
GPU, in one process, the largest first.

    python -m sweeplab.sweep.probe OUT.json STEPS SWEEP_DIR '{"grid": [[overrides], ...], "order": [...],
                                                             "alone_busy": 0.5}'

Run in the sweep's working directory (relative paths in the config mean what they mean to its jobs); each
configuration's output folder is beside OUT.json. Each configuration trains STEPS steps untracked (logger=none, one validation batch, no stop rule), sharing the
study's compile cache (what it compiles the study's jobs load). While it does, `nvidia-smi` samples the GPU every
100 ms: a configuration's busy share is the median of the utilisation samples during its timed steps (the fit's
wall-clock parts, sweeplab.core.wall, say when they ran; where fewer than MIN_STEP_SAMPLES fell there, the upper
quartile of those during its whole fit, whose set-up is idle), its memory the most the GPU held above what it held before the probe started CUDA (so the
CUDA context is in it). Where the first (largest) configuration alone keeps the GPU `alone_busy` busy, the others
are not measured: the study is not packed. Writes packing.Probe's JSON to OUT.json.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from sweeplab.core.records import JOB
from sweeplab.sweep.packing import Probe

SAMPLE_MS = 100
MIN_STEP_SAMPLES = 5  # samples within the timed steps that make their median the busy share


def probe_overrides(steps: int) -> list[str]:
    """What makes a study's job a probe: short, untracked, one validation batch, no stop rule, no checkpoint timer."""
    return [f"trainer.max_steps={steps}", f"trainer.val_check_interval={steps}", "trainer.limit_val_batches=1",
            "logger=none", "stop.at_target=false", "stop.behind=null", "stop.patience=null",
            "checkpoint.every_n_seconds=null", "replicates=1", "tune.batch_size=false"]


class GpuSampler:
    """`nvidia-smi` sampling one GPU's utilisation (%) and memory used (MB) every SAMPLE_MS, timestamped."""

    def __init__(self, gpu: str):
        self.samples: list[tuple[float, float, float]] = []
        self.total_mb: float | None = None
        try:
            self._process = subprocess.Popen(
                ["nvidia-smi", "-i", gpu, "--query-gpu=utilization.gpu,memory.used,memory.total",
                 "--format=csv,noheader,nounits", f"-lms={SAMPLE_MS}"], stdout=subprocess.PIPE, text=True)
        except OSError:
            self._process = None
            return
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self._process.stdout:
            parts = [p.strip() for p in line.split(",")]
            if len(parts) == 3 and all(p.replace(".", "", 1).isdigit() for p in parts):
                self.total_mb = float(parts[2])
                self.samples.append((time.perf_counter(), float(parts[0]) / 100, float(parts[1])))

    def between(self, start: float, end: float) -> list[tuple[float, float, float]]:
        return [s for s in self.samples if start <= s[0] <= end]

    def stop(self) -> None:
        if self._process is not None:
            self._process.terminate()
            self._process.wait(timeout=10)


def main(out: str, steps: int, sweep_dir: str, request: dict) -> int:
    import os

    from sweeplab.core import cli, wall
    from sweeplab.engine import training

    started = time.perf_counter()
    gpu = (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0]
    sampler = GpuSampler(gpu)
    time.sleep(3 * SAMPLE_MS / 1000)  # what the GPU holds before this process starts CUDA
    base = max((m for _, _, m in sampler.samples), default=None) if sampler._process is not None else None
    step_time, busy, memory = {}, [], []
    for position, index in enumerate(request["order"]):
        cfg = cli.compose("train", [*request["grid"][index], *probe_overrides(steps)])
        training.share_compile_cache(sweep_dir, cfg.get("compile_cache", "study"))
        clock = wall.start_job()  # the fit's parts: where its timed steps lie in time
        start = time.perf_counter()
        summary = training.measure(cfg, Path(out).parent / f"config{index}")
        window = sampler.between(start, time.perf_counter())
        parts = clock.totals()
        steps_from = start + parts["setup"] + parts["warmup"]
        timed = sampler.between(steps_from, steps_from + parts["steps"])
        if (step := summary.get(JOB.step_time_median)) is not None:
            step_time[index] = float(step)
        if len(timed) >= MIN_STEP_SAMPLES:
            busy.append(statistics.median([u for _, u, _ in timed]))
        elif window:  # too few samples within the steps: the busier quarter of the fit's (its set-up is idle)
            busy.append(statistics.quantiles([u for _, u, _ in window], n=4)[2] if len(window) > 1 else window[0][1])
        if window and base is not None:
            memory.append(max(m for _, _, m in window) - base)
        if position == 0 and busy and busy[0] >= request.get("alone_busy", 0.5):
            break  # the largest fills the GPU alone: the study is not packed, nothing else to measure
    sampler.stop()
    probe = Probe(step_time, max(memory, default=None), max(busy, default=None), sampler.total_mb,
                  time.perf_counter() - started)
    Path(out).write_text(probe.to_json())
    print(probe.to_json())
    return 0


if __name__ == "__main__":
    import json

    sys.exit(main(sys.argv[1], int(sys.argv[2]), sys.argv[3], json.loads(sys.argv[4])))
