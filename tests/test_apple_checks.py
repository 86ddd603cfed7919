"""What a run records about the Apple pitfalls of issue #30, checked on a CPU-only Linux host through the seams the
timer already uses (its sync and clock, torch.mps's functions, the device-name lookup): the read-back check of the
timer's clock, MPS driver-memory growth in timed steps, MFU on Apple GPUs (MPS and MLX) in the report and the bench,
MLX's own peak memory, the host's architecture and Rosetta, and the MPS fallback in the stability column."""

from __future__ import annotations

import os
import platform
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf

from conftest import smoke_config
from sweeplab import bench
from sweeplab.callbacks.timing import StepTimer, TimedFit
from sweeplab.core import host_arch, stability
from sweeplab.core.errors import UserError
from sweeplab.core.records import JOB
from sweeplab.report import tables as report
from sweeplab.runtime import devices
from sweeplab.study.sweep import sweep_from_runs
from test_timing import FakeAsyncDevice

MPS = torch.device("mps")  # a device type only: nothing here runs on it
CPU = torch.device("cpu")
M4_MAX = "Apple M4 Max (40-core GPU)"
SRC = Path(__file__).resolve().parents[1] / "src"


class DeviceResult:
    """A step's loss on the fake device: reading it back (`item`) waits until the device has done its work."""

    def __init__(self, device: FakeAsyncDevice):
        self.device, self.reads = device, 0

    def item(self) -> float:
        self.reads += 1
        self.device.sync(MPS)
        return 0.0


def _timed_fit(device: torch.device = CPU, **kwargs) -> TimedFit:
    return TimedFit(device=device, precision="32-true", log_metrics=lambda metrics, step: None,
                    samples_in=lambda batch: 2, **kwargs)


def _train(timer: StepTimer, device: FakeAsyncDevice, steps: int = 13, pause_at: int | None = None) -> DeviceResult:
    """`steps` batches of 10 ms device work each (1 ms of host work to launch); a validation of 1 s device work at
    batch `pause_at`."""
    result = DeviceResult(device)
    for i in range(steps):
        if i == pause_at:
            timer.pause()
            device.launch(1.0)
            device.sync(MPS)
        timer.batch_start()
        device.host_work(0.001)
        device.launch(0.010)
        timer.batch_end({"x": torch.zeros(2, 3)}, i, result=result)
    timer.end(steps)
    return result


# --- the read-back check of the timer's clock ------------------------------------------------------------------
@pytest.mark.parametrize("waits", [True, False])
def test_a_timer_whose_sync_does_not_wait_is_tagged_unsynchronised(waits):
    device = FakeAsyncDevice()
    sync = device.sync if waits else (lambda d: None)  # a device sync that returns at once: the clock reads launches
    timer = StepTimer(warmup_steps=1, window=4, host_probe_s=0, sync=sync, clock=device.clock)
    timer.start(_timed_fit())
    result = _train(timer, device)
    assert result.reads == 1  # once per run
    ratio = timer.summary["summary/timer_readback_ratio"]
    if waits:
        assert ratio == pytest.approx(1.0, abs=0.01)
        assert timer.run_tags() == {"timing.clock": "host", "timing.sync_check": "agrees"}
        assert not stability.apple_problems(timer.summary, {})
    else:
        assert ratio < 0.2  # 1 ms of launches against 11 ms a step
        assert timer.run_tags()["timing.sync_check"] == "unsynchronised"
        assert stability.apple_problems(timer.summary, {}) == [
            f"unsynchronised clock (timer {ratio:.0%} of a result's read-back time)"]


def test_the_read_back_check_skips_a_window_a_validation_split():
    """A validation inside the first window is not training time for the timer, but it is for a host clock run from
    the window's start: that window is not checked, the next one is."""
    device = FakeAsyncDevice()
    timer = StepTimer(warmup_steps=1, window=4, host_probe_s=0, sync=device.sync, clock=device.clock)
    timer.start(_timed_fit())
    result = _train(timer, device, pause_at=3)
    assert result.reads == 1 and timer.run_tags()["timing.sync_check"] == "agrees"
    assert timer.summary["summary/timer_readback_ratio"] == pytest.approx(1.0, abs=0.01)


# --- MPS: driver memory growing in timed steps ------------------------------------------------------------------
@pytest.fixture
def fake_mps(monkeypatch):
    """torch.mps as the timer calls it: a sync, and the driver's allocation, which grows by 40 MiB with every batch
    shape the fake MPSGraph cache has not seen (and by whatever `driver["extra"]` says)."""
    driver = {"graphs": set(), "extra": 0}
    monkeypatch.setattr(torch.mps, "synchronize", lambda: None)
    monkeypatch.setattr(torch.mps, "driver_allocated_memory",
                        lambda: (100 + 40 * len(driver["graphs"]) + driver["extra"]) * 2**20)
    return driver


def _mps_steps(timer: StepTimer, driver: dict, widths: list[int], pause_at: int | None = None) -> None:
    timer.start(_timed_fit(MPS))
    for i, width in enumerate(widths):
        if i == pause_at:
            timer.pause()
            driver["extra"] += 500  # a validation's buffers: not a timed step's
        timer.batch_start()
        driver["graphs"].add(width)  # the step ran: MPSGraph compiled and cached a graph for a new shape
        timer.batch_end({"ids": torch.zeros(2, width)}, i)
    timer.end(len(widths))


def test_mps_driver_memory_growth_in_timed_steps_is_flagged_like_new_shapes(fake_mps):
    timer = StepTimer(warmup_steps=2, window=2, warmup_per_shape=0, host_probe_s=0)
    _mps_steps(timer, fake_mps, [8, 8, 8, 16, 24, 8, 32, 8], pause_at=5)
    assert timer.summary["summary/mps_driver_growth_mb"] == 120  # three new shapes after warm-up; not the validation
    assert timer.summary["summary/new_shapes_in_timed_steps"] == 3
    assert "MPS driver memory grew 120 MiB in timed steps (graph cache or new buffers)" in stability.problems(timer.summary)

    steady = StepTimer(warmup_steps=2, window=2, warmup_per_shape=0, host_probe_s=0)
    fake_mps["graphs"].clear()
    _mps_steps(steady, fake_mps, [8] * 8, pause_at=5)
    assert steady.summary["summary/mps_driver_growth_mb"] == 0
    assert not stability.apple_problems(steady.summary, {})


# --- MFU on Apple GPUs: the device name mocked at the lookup, the timing real ----------------------------------
@pytest.fixture
def m4_max_mps(monkeypatch, fake_mps):
    """torch reporting an M4 Max with 40 GPU cores and MPS available; nothing runs on it."""
    monkeypatch.setattr(torch.backends.mps, "get_name", lambda: "Apple M4 Max")
    monkeypatch.setattr(torch.backends.mps, "get_core_count", lambda: 40)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    return devices.APPLE_GPU_FLOPS_ESTIMATE[("M4 Max", 40)]


def _bench_cell(summary: dict, backend: str) -> dict:
    cfg = OmegaConf.create({"backend": {"name": backend}, "model": {"family": "textbridge"},
                            "data": {"batch_size": 2}, "trainer": {"precision": "32-true"}, "compile": "off"})
    row = bench.BenchRow("accelerator basic", [])
    return bench.table_rows([bench.RowResult(row, cfg, sweeplab=[summary], raw=[{"samples_per_sec": 1.0}])])[0]


def test_mps_mfu_comes_from_the_apple_table_and_fills_the_report_and_the_bench(m4_max_mps, mlflow_uri):
    timer = StepTimer(warmup_steps=1, window=2, host_probe_s=0)
    timer.start(_timed_fit(MPS, flops_in=lambda batch: 2e9))
    for i in range(7):
        timer.batch_start()
        torch.ones(256, 256) @ torch.ones(256, 256)  # real work on the host, timed by the real clock
        timer.batch_end({"x": torch.zeros(2, 3)}, i)
    timer.end(7)
    summary = timer.summary
    assert summary["summary/mfu"] == pytest.approx(2e9 / summary["summary/step_time_s_median"] / m4_max_mps)

    client = MlflowClient(mlflow_uri)
    run = client.create_run(client.create_experiment("apple"), tags={"backend": "mps", "mps_fallback": "true",
                                                                      "device": devices.device_name("mps")})
    client.log_batch(run.info.run_id, metrics=[_metric(k, v) for k, v in summary.items()])
    (row,) = report.build_rows(sweep_from_runs(None, [client.get_run(run.info.run_id)]))[0]
    assert row["MFU"] == f"{summary['summary/mfu']:.1%}" and row["device"] == M4_MAX
    assert "MPS fallback on (ops MPS lacks ran on the CPU)" in row["stability"]  # the switch, in the stability column
    cells = _bench_cell(summary, "auto")  # the bench's accelerator rows: backend=auto, MPS on this (mocked) Mac
    assert cells["backend"] == "mps" and cells["device"] == M4_MAX and cells["MFU"] == f"{summary['summary/mfu']:.1%}"


def _metric(key: str, value: float):
    from mlflow.entities import Metric

    return Metric(key, float(value), 0, 0)


def test_an_mlx_gpu_run_reports_mfu_and_mlx_peak_memory(demo_dir, mlflow_uri, monkeypatch):
    mx = pytest.importorskip("mlx.core", reason="mlx is not installed (pip install 'sweeplab[mlx]')")
    from sweeplab.engine.training import train

    monkeypatch.setattr(devices, "mlx_gpu_name", lambda: M4_MAX)  # the lookup says GPU; MLX runs on the CPU here
    train(smoke_config(demo_dir, "backend=mlx", "logger.system_metrics_after_s=null", "trainer.max_steps=12",
                       "timing.window=4"))
    (run,) = MlflowClient(mlflow_uri).search_runs([e.experiment_id for e in MlflowClient(mlflow_uri).search_experiments()])
    m, tags = run.data.metrics, run.data.tags
    assert tags["device"] == f"MLX gpu ({M4_MAX})"
    assert 0 < m["summary/mfu"] < 1 and m["train/mfu"] > 0  # none without a peak: an MLX CPU run has no MFU
    # MLX's allocator peak (mx.get_peak_memory), not the process's RSS (torch, MLflow, Lightning: hundreds of MB)
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10
    assert 0 < m["summary/peak_mem_mb"] <= mx.get_peak_memory() / 2**20 and m["summary/peak_mem_mb"] < rss_mb / 4
    assert tags["timing.clock"] == "host" and tags["timing.sync_check"] == "agrees"  # loss.item() against mx.synchronize
    assert tags["platform.machine"] == platform.machine() and "rosetta" not in tags  # Linux: no sysctl to ask
    (row,) = report.build_rows(sweep_from_runs(None, [run]))[0]
    assert row["MFU"] == f"{m['summary/mfu']:.1%}" and row["device"] == f"MLX gpu ({M4_MAX})"
    assert _bench_cell(m, "mlx")["MFU"] == f"{m['summary/mfu']:.1%}"


def test_mlx_memory_falls_back_to_the_process_peak_where_mlx_keeps_none(monkeypatch):
    mx = pytest.importorskip("mlx.core", reason="mlx is not installed (pip install 'sweeplab[mlx]')")
    rss_mb = devices.peak_memory_mb(torch.device("cpu"))
    assert devices.MlxMemory(on_gpu=False).peak_mb() >= rss_mb  # on the CPU: what a CPU job reports
    monkeypatch.setattr(mx, "get_peak_memory", lambda: 7 * 2**20)
    assert devices.MlxMemory(on_gpu=True).peak_mb() == 7
    monkeypatch.delattr(mx, "get_peak_memory")
    assert devices.MlxMemory(on_gpu=True).peak_mb() >= rss_mb


# --- the host's architecture; Rosetta refused -------------------------------------------------------------------
def test_the_host_architecture_and_rosetta_are_tags(monkeypatch):
    monkeypatch.setattr(host_arch, "proc_translated", lambda: 0)
    assert host_arch.host_record().to_mlflow().tags == {JOB.platform_machine: platform.machine(), JOB.rosetta: "false"}
    monkeypatch.setattr(host_arch, "proc_translated", lambda: 1)
    assert host_arch.host_record().rosetta is True
    with pytest.raises(UserError, match="Rosetta 2 on Apple silicon"):
        host_arch.check_native()


AS_IF_TRANSLATED = """
import importlib.machinery, os, sys

class AsIfTranslated:  # sweeplab.core.host_arch as under Rosetta (sysctl.proc_translated=1); torch's first import noted
    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            open(os.environ["SWEEPLAB_TEST_RECORD"], "w").close()
        if name != "sweeplab.core.host_arch":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            module.proc_translated = lambda: 1

        spec.loader.exec_module = exec_module
        return spec

sys.meta_path.insert(0, AsIfTranslated())
"""


def test_an_x86_python_under_rosetta_is_refused_in_one_line_before_torch_loads(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(AS_IF_TRANSLATED)
    record = tmp_path / "torch_imported"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(SRC)]), "SWEEPLAB_TEST_RECORD": str(record)}
    done = subprocess.run([sys.executable, "-m", "sweeplab.train", "logger=none"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("error: this Python is") and "Rosetta 2 on Apple silicon" in line
    assert not record.exists()  # refused before torch was imported


# --- Core ML prediction in a child process (coremltools#2758) ----------------------------------------------------
def test_a_call_in_a_child_process_returns_its_result_and_its_death_is_an_error():
    from sweeplab.export.isolated import ChildFailed, in_child

    assert in_child("operator:add", 2, 40) == 42
    assert in_child("os:getpid") != os.getpid()  # another process
    with pytest.raises(ChildFailed, match=r"^os:abort was killed by SIGABRT$"):
        in_child("os:abort")  # as a failed Neural Engine compile ends the process at the first predict
    with pytest.raises(ChildFailed, match="math:sqrt failed: ValueError: math domain error"):
        in_child("math:sqrt", -1.0)


@pytest.mark.slow  # the child imports torch and coremltools: seconds
def test_prediction_runs_in_a_child_whose_failure_fails_the_check(tmp_path, monkeypatch):
    """On Linux the child's Core ML load or predict raises (no Core ML framework): the check fails with the child's
    reason, and this process goes on."""
    ct = pytest.importorskip("coremltools")
    from sweeplab.export import verify

    spec = ct.proto.Model_pb2.Model()
    spec.specificationVersion = 8
    (tmp_path / "model.mlmodel").write_bytes(spec.SerializeToString())
    monkeypatch.setattr(verify, "why_not_here", lambda path, **kwargs: None)  # as on a Mac that can load it
    cases = verify.random_cases(vocab_size=10, batch_size=1, seq_lens=[3], n=1)
    result = verify.on_device(tmp_path / "model.mlmodel", "out", cases, [np.ones((1, 3))], tolerance=1e-3)
    assert result["passed"] is False and "sweeplab.export.verify:predict_all failed" in result["error"]
    assert "coremltools#2758" in result["error"] and "\n" not in result["error"]
