"""The Apple paths (MPS, Core ML on macOS), checked on a CPU-only Linux host through the seams where each one meets
torch, coremltools or the OS: the environment when torch is first imported, a fake device type at the copy, torch
reporting no foreach kernels, fake MPS events, a faked macOS version (issue #30)."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode

import sweeplab
from sweeplab.callbacks.timing import StepTimer, TimedFit
from sweeplab.core.errors import ConfigError, UserError
from sweeplab.core.records import JOB
from sweeplab.data.sampling import ResumableShuffleBatchSampler
from sweeplab.families.textbridge.device_batches import DeviceBatches, ResidentSplit
from sweeplab.runtime import backends, devices
from sweeplab.tasks.step_graph import MultiStepGraph

SRC = Path(sweeplab.__file__).resolve().parents[1]  # the src/ directory this sweeplab is imported from
MPS = torch.device("mps")  # a device type only: nothing here runs on it
FALLBACK_VAR = "PYTORCH_ENABLE_MPS_FALLBACK"  # read by torch's library once, when it loads (MPSFallback.mm)


# --- 1. PYTORCH_ENABLE_MPS_FALLBACK is in the environment before torch loads ---------------------------------
RECORD_TORCH_IMPORT = """
import os, sys

class RecordTorchImport:  # notes the variable torch's library reads when it loads, at the first `import torch`
    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            with open(os.environ["SWEEPLAB_TEST_RECORD"], "w") as f:
                f.write(os.environ.get("PYTORCH_ENABLE_MPS_FALLBACK", "<unset>"))
            sys.meta_path.remove(self)
        return None

sys.meta_path.insert(0, RecordTorchImport())
"""


@pytest.mark.parametrize(
    "app, args, expected",
    [
        # train: plans the job (torch imported) and refuses backend=mps on this host
        ("sweeplab.train", ["backend=mps", "backend.mps_fallback=true", "logger=none"], "1"),
        ("sweeplab.train", ["backend=mps", "logger=none"], "<unset>"),  # no override: the environment is left alone
        # bench: composes its rows, then imports torch to plan them (its --help no longer imports torch at all)
        pytest.param("sweeplab.bench", ["backend=mps", "backend.mps_fallback=true"], "1", marks=pytest.mark.slow),
    ],
)
def test_the_mps_fallback_switch_is_in_the_environment_when_torch_is_first_imported(tmp_path, app, args, expected):
    import subprocess

    (tmp_path / "sitecustomize.py").write_text(RECORD_TORCH_IMPORT)
    record = tmp_path / "torch_import_env.txt"
    env = {k: v for k, v in os.environ.items() if k != FALLBACK_VAR}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(SRC), env.get("PYTHONPATH", "")])
    env["SWEEPLAB_TEST_RECORD"] = str(record)
    subprocess.run([sys.executable, "-m", app, *args], cwd=tmp_path, env=env, capture_output=True, timeout=300)
    assert record.exists(), f"{app} never imported torch"
    assert record.read_text() == expected


def test_the_command_line_override_is_read_as_hydra_writes_it():
    from sweeplab.core import mps_fallback

    assert mps_fallback.requested(["backend=mps", "backend.mps_fallback=True"]) is True
    assert mps_fallback.requested(["++backend.mps_fallback=false"]) is False
    assert mps_fallback.requested(["backend.mps_fallback=true,false"]) is None  # a sweep: no one value
    assert mps_fallback.requested(["backend.mps_fallback_x=true", "backend=mps"]) is None


def test_a_fallback_torch_did_not_load_with_is_refused_before_the_run_and_the_tag_says_what_ran(monkeypatch):
    keep = torch.get_float32_matmul_precision()  # apply_backend_settings sets it: leave it as it was
    monkeypatch.setenv(FALLBACK_VAR, "0")  # what torch loaded with in this process (the test's say-so)
    asked = backends.BackendConfig(name="mps", mps_fallback=True, matmul_precision=keep)
    with pytest.raises(ConfigError, match=r"backend\.mps_fallback.*torch was imported without"):
        backends.apply_backend_settings(asked, "mps")
    assert backends.mps_fallback_record("mps").to_mlflow().tags == {JOB.mps_fallback: "false"}
    monkeypatch.setenv(FALLBACK_VAR, "1")
    backends.apply_backend_settings(asked, "mps")  # loaded with it: nothing to refuse
    assert backends.mps_fallback_record("mps").to_mlflow().tags == {JOB.mps_fallback: "true"}
    assert backends.mps_fallback_record("cpu").to_mlflow().tags == {}


# --- 2. no non-blocking copy to a device other than CUDA -------------------------------------------------------
class RecordCopiesToMps(TorchFunctionMode):
    """Every copy to MPS `gather` makes, with its non_blocking flag; the tensor stays on the CPU (no MPS here)."""

    def __init__(self):
        super().__init__()
        self.copies: list[bool] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.to and any(isinstance(a, torch.device) and a.type == "mps" for a in args[1:]):
            self.copies.append(bool(kwargs.get("non_blocking", False)))
            return args[0]
        return func(*args, **kwargs)


def test_device_batches_copy_to_mps_blocking(monkeypatch):
    n, width = 8, 5
    split = ResidentSplit(
        input_ids=torch.arange(n * width).reshape(n, width), attention_mask=torch.ones(n, width, dtype=torch.int64),
        target=torch.randn(n, 2), sample_id=torch.arange(n), lengths=np.full(n, width, dtype=np.int64),
    )
    monkeypatch.setattr(ResidentSplit, "device", property(lambda self: MPS))  # the split lives on "MPS"
    batches = DeviceBatches(split, ResumableShuffleBatchSampler(n, 4, seed=0))
    with RecordCopiesToMps() as recorder:
        batch = batches.gather([1, 5, 2])
    assert recorder.copies == [False]  # the index list went to "MPS" once, blocking
    assert batch["sample_id"].tolist() == [1, 5, 2]


def test_only_copies_to_cuda_may_be_non_blocking():
    host = torch.zeros(3)
    assert devices.non_blocking_copy(host, torch.device("cuda"))
    assert devices.non_blocking_copy(host, "cuda:0")
    for target in ("mps", "cpu", "xpu", "meta"):
        assert not devices.non_blocking_copy(host, target), target
    assert not devices.non_blocking_copy(torch.zeros(3, device="meta"), "cuda")  # from a device it knows nothing of


def test_every_copy_in_src_goes_through_the_one_helper():
    """`non_blocking=` appears in sweeplab only where devices.non_blocking_copy decides it."""
    written = {
        f"{path.relative_to(SRC)}:{i}": line.strip()
        for path in (SRC / "sweeplab").rglob("*.py")
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if "non_blocking=" in line and path.name != "devices.py"
    }
    assert written == {}


# --- 3. clipping where torch has no foreach kernels (MPS in torch 2.13) ----------------------------------------
def _multi_step(device: torch.device, seed: int = 0):
    torch.manual_seed(seed)
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def loss_fn(batch):
        loss = (model(batch["x"]) - batch["y"]).pow(2).mean()
        return loss, {"mse": loss}

    graph = MultiStepGraph(loss_fn, optimizer, steps=2, grad_clip=1e-3, autocast_dtype=None, device=device)
    return model, graph


def test_a_batch_of_steps_clips_where_torch_has_no_foreach_kernels(monkeypatch):
    torch.manual_seed(1)
    batch = {"x": torch.randn(8, 3), "y": torch.randn(8, 1)}
    ref_model, ref_graph = _multi_step(torch.device("cpu"))
    ref_losses, _, ref_norms = ref_graph(batch, [[0.1], [0.1]])

    import torch.nn.utils.clip_grad as clip_grad

    # as torch 2.13 answers for MPS tensors (torch/utils/_foreach_utils.py lists cuda, xpu, mtia and cpu only)
    monkeypatch.setattr(clip_grad, "_device_has_foreach_support", lambda *args, **kwargs: False)
    monkeypatch.setattr(clip_grad, "_has_foreach_support", lambda *args, **kwargs: False)
    model, graph = _multi_step(MPS)
    losses, _, norms = graph(batch, [[0.1], [0.1]])
    assert torch.equal(losses, ref_losses) and torch.equal(norms, ref_norms)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), ref_model.parameters()))
    assert float(norms.min()) > 1e-3  # the gradients were clipped: the clip bit


# --- 4. the MPS timeline ----------------------------------------------------------------------------------------
def test_mps_is_timed_on_the_host_clock_after_a_device_sync_and_never_synchronizes_an_event(monkeypatch):
    events: list[str] = []

    class FakeMpsEvent:  # torch.mps.event.Event's interface, noting every call
        def __init__(self, enable_timing=False):
            events.append("created")

        def record(self):
            events.append("record")

        def synchronize(self):
            events.append("synchronize")

        def elapsed_time(self, end):
            events.append("elapsed_time")
            return 1.0

    syncs = []
    monkeypatch.setattr(torch.mps.event, "Event", FakeMpsEvent)
    monkeypatch.setattr(torch.mps, "synchronize", lambda: syncs.append(1))
    timeline = devices.timeline(MPS)
    start, end = timeline.mark(), timeline.mark()
    assert timeline.seconds(start, end) >= 0
    assert events == []  # no MPS event made (no try-out either), so none synchronised
    assert len(syncs) == 2  # torch.mps.synchronize() at each mark
    timer = StepTimer(warmup_steps=1, window=1, host_probe_s=0)
    timer.start(_timed_fit(MPS))
    assert events == [] and timer.clock_name == "host"  # what the run's timing.clock tag records


def _timed_fit(device: torch.device) -> TimedFit:
    return TimedFit(device=device, precision="32-true", log_metrics=lambda metrics, step: None,
                    samples_in=lambda batch: 1)


def test_the_timer_names_its_clock():
    timer = StepTimer(warmup_steps=1, window=1, host_probe_s=0)
    assert timer.clock_name is None  # before training starts
    timer.start(_timed_fit(torch.device("cpu")))
    assert timer.clock_name == "host"


# --- 5. Core ML checks by macOS version ------------------------------------------------------------------------
@pytest.fixture
def ct():
    return pytest.importorskip("coremltools")  # imported before any test fakes a Mac: it probes the OS on import


@pytest.fixture
def ios17_package(tmp_path, ct) -> Path:
    """A model spec of Core ML specification 8 (the iOS17 / macOS 14 target, the export's default), nothing more."""
    spec = ct.proto.Model_pb2.Model()
    spec.specificationVersion = 8
    path = tmp_path / "model.mlmodel"
    path.write_bytes(spec.SerializeToString())
    return path


@pytest.fixture
def fake_mac(monkeypatch, ct):
    """This host as a Mac of the macOS version the test sets (platform.mac_ver, as Python reads it there); Core ML
    loading and compiling faked, noting how they were called."""
    calls: dict[str, list] = {"load": [], "compile": [], "plan": []}

    class FakeMLModel:
        def __init__(self, path, compute_units=None):
            calls["load"].append(compute_units)

        def predict(self, inputs):
            return {"out": np.ones((2, 3), dtype=np.float32)}

    def as_macos(version: str) -> None:
        monkeypatch.setattr(sys, "platform", "darwin")
        monkeypatch.setattr("platform.mac_ver", lambda *args: (version, ("", "", ""), "arm64"))

    monkeypatch.setattr(ct.models, "MLModel", FakeMLModel)
    monkeypatch.setattr(ct.models.utils, "compile_model", lambda path: calls["compile"].append(path) or path)
    # prediction's child process (export/isolated.py: tests/test_apple_checks.py) called in this one, where the fakes live
    from sweeplab.export import isolated, verify

    def in_this_process(target: str, *args):
        assert target == "sweeplab.export.verify:predict_all"
        return verify.predict_all(*args)

    monkeypatch.setattr(isolated, "in_child", in_this_process)
    return SimpleNamespace(as_macos=as_macos, calls=calls)


def _prediction(path: Path) -> dict:
    from sweeplab.export import verify

    cases = verify.random_cases(vocab_size=10, batch_size=2, seq_lens=[3], n=1)
    return verify.on_device(path, "out", cases, [np.ones((2, 3), dtype=np.float32)], tolerance=1e-3)


def test_prediction_is_skipped_with_one_note_where_macos_is_older_than_the_package_target(ios17_package, fake_mac):
    fake_mac.as_macos("13.6.1")
    result = _prediction(ios17_package)
    assert fake_mac.calls["load"] == []  # loading it would abort there
    assert set(result) == {"skipped"}
    assert "macOS 14.0+" in result["skipped"] and "macOS 13.6.1" in result["skipped"]


def test_prediction_checks_the_neural_engine_with_cpu_and_ne(ios17_package, fake_mac, ct):
    fake_mac.as_macos("14.5")
    result = _prediction(ios17_package)
    assert fake_mac.calls["load"] == [ct.ComputeUnit.CPU_AND_NE]
    assert result["passed"] and result["compute_units"] == "CPU_AND_NE"


def test_the_compute_plan_needs_macos_14_4(ios17_package, fake_mac):
    from sweeplab.export import verify

    fake_mac.as_macos("14.2")
    result = verify.placement(ios17_package)
    assert fake_mac.calls["compile"] == []
    assert set(result) == {"skipped"} and "14.4" in result["skipped"]


def test_the_compute_plan_is_for_the_cpu_and_neural_engine(ios17_package, fake_mac, monkeypatch, ct):
    from coremltools.models.compute_plan import MLComputePlan

    from sweeplab.export import verify

    class MLNeuralEngineComputeDevice:  # the class name is how verify names the device
        pass

    operations = [SimpleNamespace(operator_name="mul"), SimpleNamespace(operator_name="const")]
    plan = SimpleNamespace(
        model_structure=SimpleNamespace(
            program=SimpleNamespace(functions={"main": SimpleNamespace(block=SimpleNamespace(operations=operations))})
        ),
        get_compute_device_usage_for_mlprogram_operation=lambda op: SimpleNamespace(
            preferred_compute_device=MLNeuralEngineComputeDevice()
        ),
        get_estimated_cost_for_mlprogram_operation=lambda op: SimpleNamespace(weight=1.0),
    )

    def load_from_path(path, compute_units=None):
        fake_mac.calls["plan"].append(compute_units)
        return plan

    monkeypatch.setattr(MLComputePlan, "load_from_path", load_from_path)
    fake_mac.as_macos("15.1")
    result = verify.placement(ios17_package)
    assert fake_mac.calls["plan"] == [ct.ComputeUnit.CPU_AND_NE]
    assert result["op_share"] == {"neural_engine": 1.0}


# --- 6. plan-time checks, the no-MPS message, the mlx extra ------------------------------------------------------
def test_mps_with_more_than_one_device_is_refused_at_plan_time():
    with pytest.raises(ConfigError, match=r"trainer\.devices.*one MPS device"):
        backends.check_combination("mps", "32-true", "off", devices=2)


def test_a_foreach_optimizer_on_mps_is_warned_about():
    warnings = backends.check_combination("mps", "32-true", "off", optim_implementation="foreach")
    assert any("foreach on MPS" in w for w in warnings)
    assert not any("MPS" in w for w in backends.check_combination("mps", "32-true", "off", optim_implementation="fused"))


def test_no_mps_names_the_usual_causes(monkeypatch):
    monkeypatch.setattr(sys, "platform", "darwin")
    monkeypatch.setattr(backends, "mps_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_built", lambda: True)
    monkeypatch.setattr("platform.machine", lambda: "x86_64")
    monkeypatch.setattr("platform.mac_ver", lambda *args: ("13.6", ("", "", ""), "x86_64"))
    with pytest.raises(UserError) as raised:
        backends.resolve_backend("mps")
    message = str(raised.value)
    assert "\n" not in message
    for cause in ("Intel Mac", "Rosetta", "macOS 14", "platform.machine()=x86_64", "macOS 13.6"):
        assert cause in message


def test_the_mlx_extra_installs_the_metal_wheel_on_arm64_macs_only():
    from packaging.requirements import Requirement

    pyproject = (SRC.parent / "pyproject.toml").read_text(encoding="utf-8")  # no tomllib on Python 3.10
    block = re.search(r"^mlx = \[(.*?)\]$", pyproject, re.S | re.M).group(1)
    extra = [Requirement(r) for r in re.findall(r'"([^"]+)"', block)]
    assert len(extra) == 2

    def installed(sys_platform: str, machine: str) -> list[str]:
        env = {"sys_platform": sys_platform, "platform_machine": machine, "extra": "mlx"}
        return sorted(str(r.name) + "".join(sorted(r.extras)) for r in extra if r.marker is None or r.marker.evaluate(env))

    assert installed("darwin", "arm64") == ["mlx"]
    assert installed("darwin", "x86_64") == []  # an Intel Mac, or an x86_64 Python under Rosetta
    assert installed("linux", "x86_64") == ["mlxcpu"]


# --- 7. the estimated peak FLOP/s of Apple GPUs ------------------------------------------------------------------
def test_the_apple_gpu_peak_is_looked_up_from_the_device_name(monkeypatch):
    monkeypatch.setattr(torch.backends.mps, "get_name", lambda: "Apple M4 Max")
    monkeypatch.setattr(torch.backends.mps, "get_core_count", lambda: 40)
    assert devices.device_name("mps") == "Apple M4 Max (40-core GPU)"
    entry = devices.APPLE_GPU_FLOPS_ESTIMATE[("M4 Max", 40)]
    for precision in ("32-true", "16-mixed", "bf16-mixed"):
        assert devices.peak_flops(MPS, precision) == entry
    assert devices.peak_flops(MPS, "32-true", "Apple M4 (10-core GPU)") == devices.APPLE_GPU_FLOPS_ESTIMATE[("M4", 10)]
    assert devices.peak_flops(MPS, "32-true", "Apple M4 Max (41-core GPU)") is None  # a core count never sold
    assert devices.peak_flops(MPS, "32-true", "Apple M9 Ultra (99-core GPU)") is None  # a chip the table lacks
    assert devices.peak_flops(MPS, "32-true", "Apple MPS") is None  # torch without the name or core count


def test_every_estimated_entry_is_cores_times_alus_times_two_times_a_clock():
    """The table's shape, not its numbers: an entry per (chip, GPU cores) an `apple_gpu` name finds again."""
    for (chip, cores), flops in devices.APPLE_GPU_FLOPS_ESTIMATE.items():
        assert devices.apple_gpu(f"Apple {chip} ({cores}-core GPU)") == (chip, cores)
        clock_ghz = flops / (cores * 128 * 2) / 1e9
        assert 1.0 < clock_ghz < 2.0, (chip, cores)
        assert re.fullmatch(r"M\d+( Pro| Max| Ultra)?", chip)
