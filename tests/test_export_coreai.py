"""export.format=coreai: Apple's Core AI asset (.aimodel), converted by coreai-torch and checked by Apple's runtime
(coreai-core) in a child process.

Default suite: the option checks and the refusals (missing extra, unsupported Python: no Apple package needed), and,
with the extra, one tiny converted asset: the validity checks, the runtime check, crashes in its child process.
Slow: real checkpoints of the three families through the export stage and the export app (fp32, fp16 with kept
fp32 layers, int8, enumerated lengths), the asset's bytes, a crash inside an export.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

from conftest import compose_train
from sweeplab.core.errors import ConfigError, UserError
from sweeplab.export import ExportOptions, export_checkpoint, options_from_config
from sweeplab.export.coreai_env import missing
from sweeplab.families import get_family
from sweeplab.models.gpt import GPTConfig
from sweeplab.models.textbridge import TextBridgeConfig, TextBridgeEncoder
from sweeplab.models.textbridge_decoder import DecoderConfig
from sweeplab.tasks.optim import OptimConfig

SRC = Path(__file__).resolve().parents[1] / "src"
MISSING = missing()
needs_coreai = pytest.mark.skipif(MISSING is not None, reason=f"export.format=coreai unavailable: {MISSING}")

SEQ = 16
TB_CONFIG = TextBridgeConfig(vocab_size=300, d_model=32, d_hidden=64, n_blocks=2, kernel_size=3, dilations=[1, 2],
                             out_dim=24, max_len=SEQ)
LM_CONFIG = GPTConfig(vocab_size=40000, block_size=SEQ, n_layer=2, n_head=2, d_model=32, d_ff=64, unit="paGELU",
                      alpha="learnable", unit_options={"approximate": "tanh"})
DECODER_CONFIG = DecoderConfig(vocab_size=300, embed_dim=24, max_len=SEQ, n_prefix=2, n_layer=2, n_head=2, d_model=32,
                               d_ff=64, bos_id=1, eos_id=2)


# --- options and refusals (no Apple package needed) ----------------------------------------------
def test_coreai_options_take_what_the_format_supports():
    options = ExportOptions(format="coreai", seq_lens=[8, 16])  # no iOS18 target needed: Core AI's minimum is OS 27
    assert options.suffix == ".aimodel" and ExportOptions().suffix == ".mlpackage"
    with pytest.raises(ValueError, match="compression=palettize is Core ML only"):
        ExportOptions(format="coreai", compression="palettize")
    with pytest.raises(ValueError, match="tracer=jit is Core ML only"):
        ExportOptions(format="coreai", tracer="jit")
    with pytest.raises(ValueError, match="needs deployment_target"):  # Core ML keeps its own rule
        ExportOptions(format="coreml", seq_lens=[8, 16])


def test_a_missing_extra_is_refused_in_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "coreai_torch", None)  # what an interpreter without the package sees
    with pytest.raises(ConfigError, match=r"export.format=coreai: coreai-torch not installed: pip install 'sweeplab\[coreai\]'"):
        options_from_config({"format": "coreai"})
    options_from_config({"format": "coreml"})  # Core ML never asks for it


def test_the_training_app_refuses_a_missing_extra_before_training(monkeypatch):
    from sweeplab.engine.plan import plan

    monkeypatch.setitem(sys.modules, "coreai", None)
    with pytest.raises(ConfigError, match="coreai-core not installed"):
        plan(compose_train(["export=coreai"]))


def test_an_unsupported_python_is_refused_in_one_line(monkeypatch):
    assert "needs Python >= 3.11" in missing((3, 10))
    monkeypatch.setattr(sys, "version_info", (3, 10, 14, "final", 0))
    with pytest.raises(ConfigError, match=r"export.format=coreai: needs Python >= 3.11 .*this is 3.10"):
        options_from_config({"format": "coreai"})


def test_the_export_app_refuses_a_missing_extra_in_a_real_process(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import sys\nsys.modules['coreai_torch'] = None\n")
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "sweeplab.export", f"ckpt_path={tmp_path / 'none.ckpt'}", "export.format=coreai", f"out={out}"],
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(SRC)])}, capture_output=True, text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "coreai-torch not installed: pip install 'sweeplab[coreai]'" in errors[0]
    assert not out.exists()


def test_fp32_layers_auto_keeps_the_nodes_that_leave_fp16s_range():
    from torch import nn

    from sweeplab.export import verify
    from sweeplab.export.coreai import auto_fp32_layers

    class Overflowing(nn.Module):
        def forward(self, input_ids, attention_mask):
            scaled = input_ids.float() * 1000.0  # ids up to 299: 299,000 > 65,504
            return (scaled / 1e4).tanh() * attention_mask  # back in range

    example = (torch.zeros(1, SEQ, dtype=torch.int32), torch.ones(1, SEQ, dtype=torch.int32))
    program = torch.export.export(Overflowing(), example, strict=False).run_decompositions({})
    cases = verify.random_cases(300, 1, [SEQ], 2)
    assert auto_fp32_layers(program, cases) == ["mul"]
    with pytest.raises(UserError, match="export.fp32_layers=auto needs calibration inputs"):
        auto_fp32_layers(program, [])


# --- one tiny asset: validity, the runtime check and crashes in its child -------------------------
# runtimes that die, as the check's child process runs them: a module of their own, so the child imports nothing else
CRASHES = """
import os, signal


def abort_in_child(path, runs, output_name):
    os.abort()


def killed_in_child(path, runs, output_name):
    os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.fixture
def crashes(tmp_path, monkeypatch):
    import importlib

    (tmp_path / "coreai_crashes.py").write_text(CRASHES)
    monkeypatch.syspath_prepend(str(tmp_path))  # the child gets this process's import path
    monkeypatch.delitem(sys.modules, "coreai_crashes", raising=False)
    return importlib.import_module("coreai_crashes")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(asset path, converted program, cases, PyTorch outputs) of a small TextBridge encoder, fp32, fixed length."""
    if MISSING:
        pytest.skip(f"export.format=coreai unavailable: {MISSING}")
    from sweeplab.export import coreai, verify

    torch.manual_seed(0)
    model = TextBridgeEncoder(TB_CONFIG).eval()
    options = ExportOptions(format="coreai", precision="fp32")
    converted = coreai.convert(model, "embedding", options, SEQ, TB_CONFIG.vocab_size)
    path = tmp_path_factory.mktemp("tiny") / "tiny.aimodel"
    coreai.save(converted, path, path, author="test", description="tiny", version="1", metadata={"n": "1"})
    cases = verify.random_cases(TB_CONFIG.vocab_size, 1, [SEQ], 2)
    return path, converted, cases, verify.torch_outputs(model, cases)


def _copy(path: Path, tmp_path: Path) -> Path:
    import shutil

    copy = tmp_path / path.name
    shutil.copytree(path, copy)
    return copy


@needs_coreai
def test_apples_runtime_matches_pytorch_in_a_child_process(tiny):
    from sweeplab.export import coreai

    path, converted, cases, expected = tiny
    check = coreai._runtime_check(path, converted, "embedding", cases, expected, 1e-4)
    assert check["passed"] and check["rel_err"] <= 1e-4, check  # the child also exited cleanly (model released)
    assert check["output_dtype"] == "float32"
    assert json.loads((path / "metadata.json").read_text())["creatorDefinedMetadata"]["n"] == "1"


@needs_coreai
def test_a_path_that_is_not_a_whole_asset_is_refused_before_any_load(tiny, tmp_path):
    from sweeplab.export import coreai

    path = tiny[0]
    coreai.check_asset(path)
    empty = tmp_path / "empty.aimodel"
    empty.mkdir()  # a directory the runtime would segfault on
    with pytest.raises(UserError, match="not a valid Core AI asset"):
        coreai.check_asset(empty)
    with pytest.raises(UserError, match="name must end in .aimodel"):
        coreai.check_asset(tmp_path)
    (tmp_path / "file.aimodel").write_bytes(b"x")
    with pytest.raises(UserError, match="not a Core AI asset \\(a file\\)"):
        coreai.check_asset(tmp_path / "file.aimodel")
    damaged = _copy(path, tmp_path / "d1")
    program = damaged / "main.mlirb"
    program.write_bytes(program.read_bytes()[: program.stat().st_size // 2])
    with pytest.raises(UserError, match="damaged Core AI asset: main.mlirb does not match its stored sha256"):
        coreai.check_asset(damaged)
    damaged = _copy(path, tmp_path / "d2")
    (damaged / "metadata.json").write_text("{")
    with pytest.raises(UserError, match="not a valid Core AI asset|damaged Core AI asset: metadata.json unreadable"):
        coreai.check_asset(damaged)


@needs_coreai
def test_a_damaged_asset_fails_the_runtime_check_in_one_line(tiny, tmp_path):
    from sweeplab.export import coreai

    path, converted, cases, expected = tiny
    damaged = _copy(path, tmp_path)
    (damaged / "main.mlirb").write_bytes(b"\0" * 64)
    check = coreai._runtime_check(damaged, converted, "embedding", cases, expected, 1e-4)
    assert not check["passed"]
    assert "damaged Core AI asset" in check["error"] and "\n" not in check["error"]


@needs_coreai
@pytest.mark.parametrize(("runner", "signal_name"), [("abort_in_child", "SIGABRT"), ("killed_in_child", "SIGKILL")])
def test_a_runtime_crash_fails_the_check_not_the_caller(tiny, crashes, runner, signal_name):
    from sweeplab.export import coreai

    path, converted, cases, expected = tiny
    check = coreai._runtime_check(path, converted, "embedding", cases, expected, 1e-4, runner=getattr(crashes, runner))
    assert check == {"passed": False, "tolerance": 1e-4,
                     "error": f"Core AI runtime in a child process: coreai_crashes:{runner} was killed by {signal_name}"}


# --- real checkpoints through the export stage (slow) --------------------------------------------
def _train(task, batches: list[dict], directory: Path) -> Path:
    trainer = L.Trainer(accelerator="cpu", max_steps=len(batches), logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, default_root_dir=str(directory))
    trainer.fit(task, train_dataloaders=DataLoader(batches, batch_size=None))
    path = directory / "checkpoints" / f"best-step{len(batches)}.ckpt"
    trainer.save_checkpoint(path)
    return path


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    if MISSING:
        pytest.skip(f"export.format=coreai unavailable: {MISSING}")
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    optim = OptimConfig(lr=3e-2, warmup_steps=1)
    root = tmp_path_factory.mktemp("runs")
    tb = [{"input_ids": torch.randint(0, TB_CONFIG.vocab_size, (4, SEQ), generator=g),
           "attention_mask": torch.ones(4, SEQ, dtype=torch.long), "target": torch.randn(4, TB_CONFIG.out_dim, generator=g)}
          for _ in range(3)]
    lm = [{"input_ids": (ids := torch.randint(0, LM_CONFIG.vocab_size, (2, SEQ), generator=g)), "labels": ids.roll(-1, 1)}
          for _ in range(3)]
    decoder = []
    for _ in range(3):
        ids = torch.randint(4, DECODER_CONFIG.vocab_size, (4, SEQ), generator=g)
        mask = (torch.arange(SEQ)[None] < torch.randint(1, SEQ + 1, (4, 1), generator=g)).long()
        decoder.append({"input_ids": ids * mask, "attention_mask": mask,
                        "target": torch.randn(4, DECODER_CONFIG.embed_dim, generator=g)})
    return {
        "textbridge": _train(get_family("textbridge").make_task(TB_CONFIG, {"alpha": 1.0, "beta": 0.5}, optim), tb, root / "tb"),
        "pagating_lm": _train(get_family("pagating_lm").make_task(LM_CONFIG, {}, optim), lm, root / "lm"),
        "textbridge_decoder": _train(get_family("textbridge_decoder").make_task(DECODER_CONFIG, {}, optim), decoder,
                                     root / "decoder"),
    }


def _export(checkpoint: Path, out: Path, **options):
    return export_checkpoint(checkpoint, ExportOptions(format="coreai", n_random=2, **options), out)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["textbridge", "pagating_lm", "textbridge_decoder"])
def test_each_family_exports_an_fp32_asset_verified_by_apples_runtime(checkpoints, family, tmp_path):
    result = _export(checkpoints[family], tmp_path, precision="fp32")
    report = result.report
    assert result.package == tmp_path / f"{family}-standard-fp32.aimodel" and result.package.is_dir()
    assert report["status"] == "passed", report["failure"]
    runtime = report["verification"]["runtime"]
    assert runtime["passed"] and runtime["rel_err"] <= 1e-4 and runtime["tolerance"] == 1e-4
    assert result.report_json.is_file() and result.report_md.is_file()
    markdown = result.report_md.read_text()
    assert "## What was not checked" in markdown and "needs macOS 27" in markdown
    assert report["conversion"]["mode"] == "release" and report["metadata"]["creatorDefinedMetadata"]["sweeplab.family"] == family


@pytest.mark.slow
def test_a_saved_asset_holds_no_absolute_path_of_the_building_machine(checkpoints, tmp_path):
    result = _export(checkpoints["textbridge"], tmp_path / "out", precision="fp32")
    needles = {str(checkpoints["textbridge"]), str(checkpoints["textbridge"].parent), str(tmp_path),
               str(Path.home()), os.getcwd(), str(SRC)}
    files = [p for p in result.package.rglob("*") if p.is_file()]
    assert files
    for path in files:
        data = path.read_bytes()
        found = [needle for needle in needles if needle.encode() in data]
        assert not found, f"{path.name} holds {found}"
    # the metadata names the checkpoint by file name (the report beside the asset has its path)
    metadata = json.loads((result.package / "metadata.json").read_text())["creatorDefinedMetadata"]
    assert metadata["sweeplab.checkpoint"] == checkpoints["textbridge"].name
    assert all(isinstance(value, str) for value in metadata.values())


@pytest.mark.slow
def test_the_export_app_writes_a_verified_asset_and_its_report(checkpoints, tmp_path):
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "sweeplab.export", f"ckpt_path={checkpoints['textbridge']}", "export.format=coreai",
         "export.precision=fp32", "export.seq_lens=[8,16]", f"out={out}"],
        env={**os.environ, "PYTHONPATH": str(SRC)}, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr
    package = out / "textbridge-standard-fp32.aimodel"
    report = json.loads((out / "textbridge-standard-fp32.coreai.report.json").read_text())
    assert package.is_dir() and report["status"] == "passed"
    assert report["conversion"]["functions"] == {"8": "main_s8", "16": "main_s16"}
    assert {row["case"].split(" #")[0] for row in report["verification"]["runtime"]["cases"]} == {"random S=8", "random S=16"}
    assert sorted(report["interface"]) == ["main_s16", "main_s8"]


@pytest.mark.slow
def test_encoder_fp16_with_kept_fp32_layers_is_checked_as_fp16(checkpoints, tmp_path):
    from sweeplab.export.coreai import TOLERANCE_FP16_RUNTIME

    plain = _export(checkpoints["textbridge"], tmp_path / "plain", precision="fp16").report
    kept = _export(checkpoints["textbridge"], tmp_path / "kept", precision="fp16", fp32_layers=["convolution_3"]).report
    for report in (plain, kept):
        assert report["status"] == "passed", report["failure"]
        verification = report["verification"]
        # fp16 on the runtime against its own tolerance; the cast graph in PyTorch; the fp32 program on the runtime
        assert verification["runtime"]["tolerance"] == TOLERANCE_FP16_RUNTIME
        assert verification["runtime"]["output_dtype"] == "float16"
        assert verification["cast_graph"]["passed"] and verification["cast_graph"]["tolerance"] == 1e-2
        assert verification["fp32_twin"]["passed"] and verification["fp32_twin"]["rel_err"] <= 1e-4
        assert f"tolerance {TOLERANCE_FP16_RUNTIME:.0e}" in report["summary"]
    assert kept["conversion"]["fp32_layers"] == ["convolution_3"]
    # the kept convolution's weights stay fp32 in the asset
    assert kept["weights"]["by_dtype"]["Float32"] > plain["weights"]["by_dtype"].get("Float32", 0) + 1000
    with pytest.raises(UserError, match="export.fp32_layers: no layer named 'conv_9'"):
        _export(checkpoints["textbridge"], tmp_path / "bad", precision="fp16", fp32_layers=["conv_9"])
    assert not (tmp_path / "bad").exists()


@pytest.mark.slow
def test_the_decoder_step_in_fp16_takes_its_embedding_as_fp16(checkpoints, tmp_path):
    report = _export(checkpoints["textbridge_decoder"], tmp_path, precision="fp16").report
    assert report["status"] == "passed", report["failure"]
    assert report["conversion"]["input_dtypes"] == {"input_ids": "int32", "attention_mask": "int32", "embedding": "float16"}
    assert report["verification"]["cast_graph"]["passed"] and report["verification"]["fp32_twin"]["rel_err"] <= 1e-4


@pytest.mark.slow
def test_encoder_int8_weights(checkpoints, tmp_path):
    report = _export(checkpoints["textbridge"], tmp_path, precision="fp32", compression="int8").report
    assert report["status"] == "passed", report["failure"]
    assert report["weights"]["by_dtype"]["Int8"] > 20000  # the convolutions' and the embedding's weights
    assert report["verification"]["runtime"]["tolerance"] == 5e-2
    assert 1e-4 < report["verification"]["runtime"]["rel_err"] <= 5e-2  # int8, not the fp32 weights


@pytest.mark.slow
def test_a_runtime_crash_during_an_export_publishes_nothing(checkpoints, crashes, tmp_path, monkeypatch):
    from sweeplab.export import coreai

    monkeypatch.setattr(coreai, "run_functions", crashes.abort_in_child)
    out = tmp_path / "out"
    with pytest.raises(UserError, match=r"verification failed \(Core AI runtime in a child process: .* killed by SIGABRT\)"):
        _export(checkpoints["textbridge"], out, precision="fp32")
    assert not (out / "textbridge-standard-fp32.aimodel").exists()
    assert sorted(p.name for p in out.iterdir()) == ["textbridge-standard-fp32.coreai.failed-report.json",
                                                     "textbridge-standard-fp32.coreai.failed-report.md"]





def test_options_core_ai_ignores_are_refused_not_ignored():
    from sweeplab.export.__main__ import check_conflicts

    options = ExportOptions(format="coreai", compression="int8")
    for key in ("export.deployment_target", "export.weight_threshold"):
        with pytest.raises(ConfigError, match=f"{key}: applies only with export.format=coreml"):
            check_conflicts({key}, options, {})
    check_conflicts({"export.deployment_target"}, ExportOptions(), {})


@pytest.mark.slow
def test_the_training_app_exports_each_jobs_best_checkpoint_as_an_aimodel(demo_dir, mlflow_uri, tmp_path):
    if MISSING:
        pytest.skip(f"export.format=coreai unavailable: {MISSING}")
    from mlflow.tracking import MlflowClient
    from omegaconf import open_dict

    from conftest import smoke_config
    from sweeplab.engine.training import train

    cfg = smoke_config(demo_dir, "model.max_len=32", "export=coreai", "export.precision=fp32", "export.n_random=1")
    with open_dict(cfg):
        cfg.trainer.enable_progress_bar = False
    train(cfg)
    client = MlflowClient(mlflow_uri)
    (run,) = [r for r in client.search_runs([e.experiment_id for e in client.search_experiments()])
              if r.data.tags.get("family") == "textbridge"]
    logged = {a.path for a in client.list_artifacts(run.info.run_id, "coreai")}
    assert {"coreai/textbridge-standard-fp32.aimodel", "coreai/textbridge-standard-fp32.coreai.report.md"} <= logged
    assert client.get_run(run.info.run_id).data.metrics["export/standard-fp32/rel_err"] <= 1e-4


@pytest.mark.slow
def test_an_asset_damaged_before_its_check_fails_the_export_in_one_line(checkpoints, tmp_path, monkeypatch):
    from sweeplab.export import coreai

    save = coreai.save

    def save_then_damage(converted, path, shown, **kwargs):
        save(converted, path, shown, **kwargs)
        program = path / "main.mlirb"
        program.write_bytes(program.read_bytes()[:100])

    monkeypatch.setattr(coreai, "save", save_then_damage)
    out = tmp_path / "out"
    target = out / "textbridge-standard-fp32.aimodel"
    with pytest.raises(UserError) as raised:
        _export(checkpoints["textbridge"], out, precision="fp32")
    assert str(raised.value) == f"{target}: damaged Core AI asset: main.mlirb does not match its stored sha256 (main.hash)"
    assert not out.exists()  # nothing published, no report, not even the folder made for it
