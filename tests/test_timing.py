"""The throughput numbers are honest: samples/s x the true window time = the samples processed, on a fake
asynchronous device where a clock read without a sync would time only the kernel launches."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, Dataset

from sweeplab.callbacks.timing import ThroughputTimer
from sweeplab.runtime import devices
from sweeplab.runtime.devices import hopper_chip, peak_flops

BATCH = 4


class FakeAsyncDevice:
    """A host that queues work on a device which runs it later, like CUDA or MPS.

    `launch(seconds)` costs the host `launch_cost` and queues `seconds` of device work; `clock()` is the host's
    time; `sync()` makes the host wait until the queue is empty. Only a synced clock sees the device's work.
    """

    def __init__(self, launch_cost: float = 1e-4):
        self.launch_cost = launch_cost
        self.host = 0.0
        self.device_free_at = 0.0
        self.syncs = 0

    def launch(self, seconds: float) -> None:
        self.host += self.launch_cost
        self.device_free_at = max(self.device_free_at, self.host) + seconds

    def host_work(self, seconds: float) -> None:  # data loading, Python overhead
        self.host += seconds

    def sync(self, device: torch.device) -> None:
        self.syncs += 1
        self.host = max(self.host, self.device_free_at)

    def clock(self) -> float:
        return self.host


class FakeDeviceTimeline:
    """Events on the fake device, as sweeplab.runtime.devices.DeviceTimeline records them on CUDA/MPS: a mark costs the host
    nothing and is stamped when the device reaches it (at once if it is idle); reading the time between two marks
    makes the host wait until the device reached the later one."""

    def __init__(self, device: FakeAsyncDevice):
        self.fake = device

    def mark(self) -> float:
        return max(self.fake.device_free_at, self.fake.host)

    def seconds(self, start: float, end: float) -> float:
        self.fake.host = max(self.fake.host, end)
        return end - start


def step_work(batch_index: int) -> float:
    """Device seconds of training step `batch_index`: uneven, so a wrong window boundary shows."""
    return 0.010 + 0.004 * (batch_index % 3)


class Numbers(Dataset):
    def __len__(self) -> int:
        return 10_000

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((3,), float(i))


class FakeDeviceTask(L.LightningModule):
    """Each training step queues `step_work` seconds on the fake device; validation queues 1 s per batch."""

    def __init__(self, device: FakeAsyncDevice, data_seconds: float = 0.0):
        super().__init__()
        self.layer = torch.nn.Linear(3, 1)
        self.fake = device
        self.data_seconds = data_seconds
        self.batches = 0
        self.work_log: list[float] = []  # device seconds of every training batch, in order

    def training_step(self, batch, batch_idx):
        self.fake.host_work(self.data_seconds)
        work = step_work(self.batches)
        self.fake.launch(work)
        self.work_log.append(work)
        self.batches += 1
        return self.layer(batch).pow(2).mean()

    def validation_step(self, batch, batch_idx):
        self.fake.launch(1.0)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-3)

    def train_dataloader(self):
        return DataLoader(Numbers(), batch_size=BATCH)

    def val_dataloader(self):
        return DataLoader(Numbers(), batch_size=BATCH)

    # what the timer asks of a sweeplab task
    def samples_in(self, batch) -> int:
        return int(batch.shape[0])

    def tokens_in(self, batch) -> torch.Tensor:
        return torch.tensor(batch.shape[0] * 7)  # a tensor, as a device-side token count would be

    def flops_in(self, batch) -> None:
        return None


def _fit(timer: ThroughputTimer, task: FakeDeviceTask, max_steps: int, accumulate: int = 1, val_every: int | None = None,
         callbacks: list = ()):
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=max_steps,
        callbacks=[timer, *callbacks],
        logger=False,
        enable_checkpointing=bool(callbacks),
        enable_progress_bar=False,
        enable_model_summary=False,
        accumulate_grad_batches=accumulate,
        val_check_interval=val_every * accumulate if val_every else None,
        check_val_every_n_epoch=None if val_every else 1,
        limit_val_batches=2 if val_every else 0,
        num_sanity_val_steps=0,
    )
    trainer.fit(task)
    return trainer


def _true_window_seconds(task: FakeDeviceTask, warmup_batches: int, window_batches: int) -> list[float]:
    timed = task.work_log[warmup_batches:]
    n_full = len(timed) // window_batches
    return [sum(timed[i * window_batches : (i + 1) * window_batches]) for i in range(n_full)]


@pytest.mark.parametrize("accumulate", [1, 2])
def test_samples_per_sec_times_true_window_time_is_the_samples_processed(accumulate):
    device = FakeAsyncDevice()
    task = FakeDeviceTask(device)
    timer = ThroughputTimer(warmup_steps=3, window=5, sync=device.sync, clock=device.clock)
    _fit(timer, task, max_steps=33, accumulate=accumulate)

    truth = _true_window_seconds(task, 3 * accumulate, 5 * accumulate)
    assert len(timer.windows) == len(truth) == 6
    for window, seconds in zip(timer.windows, truth):
        samples = 5 * accumulate * BATCH
        assert window["samples"] == samples
        assert window["train/samples_per_sec"] * seconds == pytest.approx(samples, rel=0.03)
        assert window["train/step_time_s"] == pytest.approx(seconds / 5, rel=0.03)
        assert window["train/tokens_per_sec"] == pytest.approx(7 * samples / seconds, rel=0.03)
    # the totals cover every timed step, the last partial window included
    timed_seconds = sum(task.work_log[3 * accumulate :])
    summary = timer.summary
    assert summary["summary/samples_per_sec_overall"] * timed_seconds == pytest.approx(30 * accumulate * BATCH, rel=0.03)
    assert summary["summary/timed_steps"] == 30
    # the headline throughput is the median step time's: samples per step / median step time, exactly
    assert summary["summary/samples_per_sec"] == pytest.approx(accumulate * BATCH / summary["summary/step_time_s_median"])
    # what the stop rules read at a validation is the figure the run records at the end
    assert timer.samples_per_step_so_far() == summary["summary/samples_per_step"] == accumulate * BATCH


def test_an_unsynchronised_clock_would_be_wrong_on_the_fake_device():
    """The fake device is asynchronous enough to matter: without syncs the same callback reports nonsense."""
    device = FakeAsyncDevice()
    task = FakeDeviceTask(device)
    timer = ThroughputTimer(warmup_steps=3, window=5, sync=lambda d: None, clock=device.clock)
    _fit(timer, task, max_steps=23)
    truth = _true_window_seconds(task, 3, 5)
    errors = [w["train/samples_per_sec"] * s / w["samples"] for w, s in zip(timer.windows, truth)]
    assert min(errors) > 10  # launch time only: throughput overstated by more than 10x


def test_validation_and_warmup_are_not_training_time():
    device = FakeAsyncDevice()
    task = FakeDeviceTask(device)
    timer = ThroughputTimer(warmup_steps=2, window=4, sync=device.sync, clock=device.clock)
    _fit(timer, task, max_steps=18, val_every=7)  # validations (2 s of device work each) inside windows 2 and 3
    truth = _true_window_seconds(task, 2, 4)
    assert len(timer.windows) == 4
    for window, seconds in zip(timer.windows, truth):
        assert window["train/samples_per_sec"] * seconds == pytest.approx(window["samples"], rel=0.03)
    assert timer.summary["summary/step_time_s_median"] < 0.1  # a 2 s validation would dominate any window


def test_a_periodic_checkpoint_is_not_training_time(tmp_path):
    device = FakeAsyncDevice()
    task = FakeDeviceTask(device)

    class SlowSave(L.Callback):  # the checkpoint file takes 1 s to write, after every callback's on_save_checkpoint
        saves = 0

        def on_save_checkpoint(self, trainer, pl_module, checkpoint):
            SlowSave.saves += 1
            device.host_work(1.0)

    periodic = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=5, save_top_k=0, save_last=True)
    timer = ThroughputTimer(warmup_steps=2, window=4, sync=device.sync, clock=device.clock)
    _fit(timer, task, max_steps=18, callbacks=[SlowSave(), periodic])
    assert SlowSave.saves >= 3  # at steps 5, 10, 15 (inside windows 1, 2 and 4)
    truth = _true_window_seconds(task, 2, 4)
    for window, seconds in zip(timer.windows, truth):
        assert window["train/samples_per_sec"] * seconds == pytest.approx(window["samples"], rel=0.03)
    assert timer.summary["summary/step_time_s_median"] < 0.1


def test_the_profile_leaves_a_periodic_checkpoint_out_as_the_clock_does(tmp_path):
    device = FakeAsyncDevice()
    task = FakeDeviceTask(device)

    class SlowSave(L.Callback):
        def on_save_checkpoint(self, trainer, pl_module, checkpoint):
            device.host_work(1.0)

    periodic = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=5, save_top_k=0, save_last=True)
    timer = ThroughputTimer(warmup_steps=2, window=4, profile=True, profile_dir=str(tmp_path), sync=device.sync,
                            clock=device.clock)
    _fit(timer, task, max_steps=18, callbacks=[SlowSave(), periodic])
    timed = sum(task.work_log[2:])
    shares_ms = {k: v for k, v in timer.summary.items() if k.startswith("profile/") and k.endswith("_ms")}
    step_ms = sum(shares_ms.values())
    assert step_ms == pytest.approx(1000 * timed / 16, rel=0.05)  # 3 one-second saves would add ~190 ms a step


def test_compilations_inside_the_timed_steps_are_counted_not_those_in_warmup():
    device = FakeAsyncDevice()
    compiled = torch.compile(lambda x: x * 2, backend="eager", dynamic=False)  # dynamo counts graphs per backend too

    class Compiling(FakeDeviceTask):
        def training_step(self, batch, batch_idx):
            compiled(torch.ones(3 if self.batches < 6 else 4))  # compiles at batch 0 (warm-up) and at batch 6 (timed)
            return super().training_step(batch, batch_idx)

    timer = ThroughputTimer(warmup_steps=2, window=4, sync=device.sync, clock=device.clock)
    _fit(timer, Compiling(device), max_steps=12)
    assert timer.summary["summary/compiles_in_timed_steps"] == 1


def test_data_loading_between_batches_is_inside_the_window():
    device = FakeAsyncDevice(launch_cost=0.0)
    task = FakeDeviceTask(device, data_seconds=0.05)  # host-bound: the device idles while the host loads data
    timer = ThroughputTimer(warmup_steps=1, window=4, sync=device.sync, clock=device.clock)
    _fit(timer, task, max_steps=9)
    for window in timer.windows:
        # each step: 0.05 s of host work, then its device work; the queue never overlaps a later data load
        # more than one step, so a window takes at least 4 data loads
        assert window["train/step_time_s"] >= 0.05


def test_syncs_only_at_window_edges():
    device = FakeAsyncDevice()
    task = FakeDeviceTask(device)
    timer = ThroughputTimer(warmup_steps=2, window=10, sync=device.sync, clock=device.clock)
    _fit(timer, task, max_steps=45)
    assert device.syncs == 1 + 4 + 1  # warm-up end, 4 window ends, the partial window at the end


def test_summary_has_median_p10_p90_spread_and_memory():
    timer = ThroughputTimer(warmup_steps=0, window=1)
    timer.windows = [{"train/step_time_s": t} for t in (1.0, 2.0, 3.0, 4.0, 100.0)]
    timer._total.update(batches=5, samples=50, tokens=500, elapsed=110.0)
    summary = timer.summarize()
    assert summary["summary/step_time_s_median"] == 3.0
    assert 4.0 < summary["summary/step_time_s_p90"] <= 100.0
    assert 1.0 <= summary["summary/step_time_s_p10"] < 2.0
    spread = (summary["summary/step_time_s_p90"] - summary["summary/step_time_s_p10"]) / 3.0
    assert summary["summary/step_time_spread"] == pytest.approx(spread)
    # samples/s and median step time are one statistic: 10 samples a step / 3 s; the stopwatch figure apart
    assert summary["summary/samples_per_sec"] == pytest.approx(10 / 3.0)
    assert summary["summary/tokens_per_sec"] == pytest.approx(100 / 3.0)
    assert summary["summary/samples_per_sec_overall"] == pytest.approx(50 / 110)
    assert "summary/peak_mem_mb" in summary


def test_warmup_and_window_are_checked():
    with pytest.raises(ValueError, match="warmup_steps"):
        ThroughputTimer(warmup_steps=-1)
    with pytest.raises(ValueError, match="window"):
        ThroughputTimer(window=0)


@pytest.mark.parametrize(
    "name, precision, expected",
    [
        ("NVIDIA H200", "bf16-mixed", 989.4e12),  # dense: Lightning's table has the 2:4-sparse 2.0e15 for H200
        ("NVIDIA H200 NVL", "bf16-mixed", 835.5e12),
        ("NVIDIA H100 80GB HBM3", "bf16-mixed", 989.4e12),
        ("NVIDIA H100 80GB HBM3", "16-mixed", 989.4e12),
        ("NVIDIA H100 PCIe", "bf16-mixed", 756e12),
        ("NVIDIA H100 80GB HBM3", "32-true", 494.7e12),  # tf32 matmuls (matmul precision "high")
    ],
)
def test_dense_hopper_peaks(name, precision, expected, monkeypatch):
    monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: "high")
    assert peak_flops(torch.device("cuda"), precision, device_name=name) == expected


def test_no_peak_on_cpu_or_mps():
    assert peak_flops(torch.device("cpu"), "bf16-mixed") is None
    assert peak_flops(torch.device("mps"), "32-true") is None
    assert hopper_chip("NVIDIA A100-SXM4-80GB") is None


def test_mps_is_synchronised(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.mps, "synchronize", lambda: calls.append("mps"))
    devices.synchronize(torch.device("mps"))
    devices.synchronize(torch.device("cpu"))
    assert calls == ["mps"]


def test_mps_memory_is_the_driver_allocation(monkeypatch):
    monkeypatch.setattr(torch.mps, "driver_allocated_memory", lambda: 3 * 2**20)
    assert devices.peak_memory_mb(torch.device("mps")) == 3.0
    assert devices.peak_memory_mb(torch.device("cpu")) > 10  # this process's RSS, in MiB


def test_device_timeline_marks_never_make_the_device_wait():
    """Host work between steps nearly as long as the device's: after a sync the device idles until the host has
    launched the next step, so a timer that syncs at its window edges slows the steps it times. Marks on the device's
    timeline (read a window later) leave the queue full: every window's time is the device's work in it."""
    def run(timeline):
        device = FakeAsyncDevice()
        task = FakeDeviceTask(device, data_seconds=0.009)  # device work per step: 10-18 ms
        if timeline:
            timer = ThroughputTimer(warmup_steps=3, window=4, timeline=lambda d: FakeDeviceTimeline(device))
        else:
            timer = ThroughputTimer(warmup_steps=3, window=4, sync=device.sync, clock=device.clock)
        _fit(timer, task, max_steps=43)
        truth = _true_window_seconds(task, 3, 4)
        assert len(timer.windows) == len(truth) == 10
        return [w["train/step_time_s"] * 4 / seconds for w, seconds in zip(timer.windows, truth)]

    assert run(timeline=True) == pytest.approx([1.0] * 10, rel=0.01)
    assert min(run(timeline=False)) > 1.1  # each window also holds the idle gap its sync caused


def test_device_timeline_reads_a_window_after_the_next_is_queued_and_keeps_validation_out():
    device = FakeAsyncDevice()
    task = FakeDeviceTask(device)
    timer = ThroughputTimer(warmup_steps=2, window=4, timeline=lambda d: FakeDeviceTimeline(device))
    _fit(timer, task, max_steps=18, val_every=7)  # validations (2 s of device work each) inside windows 2 and 3
    truth = _true_window_seconds(task, 2, 4)
    assert len(timer.windows) == 4
    for window, seconds in zip(timer.windows, truth):
        assert window["train/samples_per_sec"] * seconds == pytest.approx(window["samples"], rel=0.03)
    timed_seconds = sum(task.work_log[2:])
    assert timer.summary["summary/samples_per_sec_overall"] * timed_seconds == pytest.approx(16 * BATCH, rel=0.03)


def test_a_device_without_timed_events_times_on_the_host_clock(caplog):
    """The CPU has no queue to mark; a CUDA or MPS device whose events cannot be timed (here: none at all) falls back
    to the host clock with one warning instead of failing at the first window (tests/test_gpu.py: CUDA's events)."""
    assert type(devices.timeline(torch.device("cpu"))) is devices.HostTimeline
    if not torch.cuda.is_available():
        assert type(devices.timeline(torch.device("cuda"))) is devices.HostTimeline
        assert "has no timed events" in caplog.text


BURSTY = """
import os, sys, time
os.sched_setaffinity(0, {int(sys.argv[1])})
print("busy", flush=True)
while True:  # busy 30 ms in every 60
    end = time.perf_counter() + 0.03
    while time.perf_counter() < end:
        pass
    time.sleep(0.03)
"""


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs CPU affinity (Linux)")
def test_the_host_probe_sees_a_process_that_takes_the_cpu_in_bursts():
    """A real process sharing this process's CPU in bursts, as a noisy neighbour on a VM does, makes the host's own
    speed waver: the probe says so; without it the same CPU reads steady. (Load average reads the same in both:
    one busy process on a host of several CPUs.)"""
    from sweeplab.core.stability import UNSTEADY_HOST

    cpu = min(os.sched_getaffinity(0))
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})
    try:
        quiet = statistics.median(devices.host_speed_spread(0.25) for _ in range(3))
        if quiet >= UNSTEADY_HOST:  # the premise needs a steady CPU; on a busy host there is nothing to compare with
            pytest.skip(f"this host wavers already without the neighbour (spread {quiet:.2f} >= {UNSTEADY_HOST}): "
                        "the probe cannot be shown to see the neighbour here")
        neighbour = subprocess.Popen([sys.executable, "-c", BURSTY, str(cpu)], stdout=subprocess.PIPE, text=True)
        try:
            assert neighbour.stdout.readline().strip() == "busy"
            shared = statistics.median(devices.host_speed_spread(0.25) for _ in range(3))
        finally:
            neighbour.kill()
            neighbour.wait()
    finally:
        os.sched_setaffinity(0, before)
    assert quiet < UNSTEADY_HOST < shared, (quiet, shared)
