"""The export stage on trained checkpoints of both families: every variant verified, errors, atomicity, MLflow.

Checkpoints here are real Lightning checkpoints of the real tasks, trained for a few steps on random batches
(seconds); the slow test at the end trains with the training app's `debug=smoke` and exports what it wrote.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from sweeplab.core.errors import UserError
from sweeplab.export import ExportOptions, export_after_training, export_checkpoint, load_program
from sweeplab.export.verify import check_weights
from sweeplab.families import get_family
from sweeplab.models.gpt import GPT, GPTConfig
from sweeplab.models.textbridge import TextBridgeConfig
from sweeplab.study.sweep import sweep_from_runs
from sweeplab.tasks.optim import OptimConfig

TB_VOCAB, LM_VOCAB, SEQ = 300, 40000, 16  # an LM vocabulary past int16: ids a 16-bit cast would break are tested
TB_CONFIG = TextBridgeConfig(
    vocab_size=TB_VOCAB, d_model=32, d_hidden=64, n_blocks=2, kernel_size=3, dilations=[1, 2], out_dim=24, max_len=SEQ
)
LM_CONFIG = GPTConfig(
    vocab_size=LM_VOCAB, block_size=SEQ, n_layer=2, n_head=2, d_model=32, d_ff=64, unit="paGELU", alpha="learnable",
    unit_options={"approximate": "tanh"},
)
VARIANTS = {
    "fp32": {"precision": "fp32"},
    "fp16": {"precision": "fp16"},
    "ane": {"layout": "ane"},
    "int8": {"compression": "int8"},
}


def _train(task, batches: list[dict], directory: Path) -> Path:
    trainer = L.Trainer(
        accelerator="cpu", max_steps=len(batches), logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, default_root_dir=str(directory),
    )
    trainer.fit(task, train_dataloaders=DataLoader(batches, batch_size=None))
    path = directory / "checkpoints" / f"best-step{len(batches)}.ckpt"
    trainer.save_checkpoint(path)
    return path


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    optim = OptimConfig(lr=3e-2, warmup_steps=1)
    tb_batches = [
        {
            "input_ids": torch.randint(0, TB_VOCAB, (4, SEQ), generator=g),
            "attention_mask": torch.ones(4, SEQ, dtype=torch.long),
            "target": torch.randn(4, TB_CONFIG.out_dim, generator=g),
        }
        for _ in range(3)
    ]
    lm_batches = [
        {"input_ids": (ids := torch.randint(0, LM_VOCAB, (2, SEQ), generator=g)), "labels": ids.roll(-1, 1)}
        for _ in range(3)
    ]
    root = tmp_path_factory.mktemp("runs")
    tb_task = get_family("textbridge").make_task(TB_CONFIG, {"alpha": 1.0, "beta": 0.5}, optim)
    lm_task = get_family("pagating_lm").make_task(LM_CONFIG, {}, optim)
    return {"textbridge": _train(tb_task, tb_batches, root / "tb"), "pagating_lm": _train(lm_task, lm_batches, root / "lm")}


@pytest.fixture(scope="module")
def real_data(tmp_path_factory) -> dict[str, Path]:
    """Real-format inputs: a token-mode JSONL for TextBridge, an LM-cache style uint16 token file for the LM."""
    from sweeplab.families.textbridge.formats import Sample, write_jsonl

    root = tmp_path_factory.mktemp("data")
    rng = np.random.default_rng(0)
    samples = [
        Sample(target=np.zeros(TB_CONFIG.out_dim, np.float32), input_ids=rng.integers(1, TB_VOCAB, n),
               attention_mask=np.ones(n, np.uint8))
        for n in (5, 16, 30, 9, 12, 3, 16, 7)
    ]
    write_jsonl(root / "tb.tokens.jsonl", samples, mode="tokens")
    rng.integers(0, 65535, 4000).astype(np.uint16).tofile(root / "valid-0.uint16.bin")  # ids up to 65534 ...
    tokens = np.fromfile(root / "valid-0.uint16.bin", dtype=np.uint16) % LM_VOCAB  # ... folded into the vocabulary
    tokens.astype(np.uint16).tofile(root / "valid-0.uint16.bin")
    return {"textbridge": root / "tb.tokens.jsonl", "pagating_lm": root / "valid-0.uint16.bin"}


_exports: dict = {}


@pytest.fixture
def exported(checkpoints, real_data, tmp_path_factory):
    """(family, variant) -> ExportResult; each export runs once per module."""

    def get(family: str, variant: str):
        if (family, variant) not in _exports:
            options = ExportOptions(**VARIANTS[variant], real_data=str(real_data[family]), n_random=2, n_real=2)
            out = tmp_path_factory.mktemp(f"{family}-{variant}")
            _exports[family, variant] = export_checkpoint(checkpoints[family], options, out)
        return _exports[family, variant]

    return get


# --- every variant of both models ----------------------------------------------------------------
@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("family", ["textbridge", "pagating_lm"])
def test_variant_exports_and_verifies(exported, family, variant):
    result = exported(family, variant)
    report = result.report
    assert report["status"] == "passed", report["failure"]
    reference = report["verification"]["reference"]
    assert reference["passed"] and reference["nonfinite"] == 0
    assert reference["rel_err"] <= ExportOptions(**VARIANTS[variant]).verify_tolerance
    assert any(c["case"].startswith("real") for c in reference["cases"])
    assert any(c["case"].startswith("random") for c in reference["cases"])
    assert report["verification"]["trained_weights"]["passed"]
    assert report["verification"]["nonfinite_constants"] == []
    assert report["conversion"]["tracer"] == "torch.export"
    assert "skipped" in report["on_device"] and "skipped" in report["placement"]  # no Mac here
    # the package, its two reports, nothing else (no staging dirs)
    assert sorted(p.name for p in result.package.parent.iterdir()) == sorted(
        [result.package.name, result.report_json.name, result.report_md.name]
    )
    assert json.loads(result.report_json.read_text())["status"] == "passed"
    markdown = result.report_md.read_text()
    assert "rel_err" in markdown and "## Ops" in markdown and "needs macOS" in markdown
    print(f"\n{family} {report['variant']}: rel_err {reference['rel_err']:.2e} max_abs {reference['max_abs_err']:.2e} "
          f"size {report['weights']['package_bytes'] / 1e3:.1f} kB convert {report['conversion']['convert_s']:.2f} s")


def test_layouts_and_dtypes_are_what_was_asked(exported):
    ane = exported("pagating_lm", "ane").report
    assert "conv" in ane["ops"] and "einsum" in ane["ops"] and "linear" not in ane["ops"]
    standard = exported("pagating_lm", "fp16").report
    assert "linear" in standard["ops"] and "conv" not in standard["ops"]
    # the tied embedding is stored once in both layouts (lookup table and output projection share it)
    assert ane["weights"]["weight_file_bytes"] < 1.1 * standard["weights"]["weight_file_bytes"]
    assert "fp16" in standard["weights"]["by_dtype"] and "fp32" not in standard["weights"]["by_dtype"]
    assert "fp32" in exported("pagating_lm", "fp32").report["weights"]["by_dtype"]
    int8 = exported("textbridge", "int8").report
    assert "int8" in int8["weights"]["by_dtype"] and any(op.startswith("constexpr_") for op in int8["ops"])
    assert int8["weights"]["package_bytes"] < exported("textbridge", "fp16").report["weights"]["package_bytes"]


def test_package_holds_the_checkpoint_weights_not_fresh_ones(exported, checkpoints):
    state = torch.load(checkpoints["pagating_lm"], weights_only=True)["state_dict"]
    program = load_program(exported("pagating_lm", "fp32").package)
    weights = program.weights()
    for name in ("blocks.0.mlp.unit.value_proj.weight", "blocks.1.mlp.unit.gate_proj.weight", "blocks.1.mlp.proj.weight"):
        const = "p_" + name.replace(".", "_")
        np.testing.assert_array_equal(weights[const], state[f"model.{name}"].numpy())  # fp32: bit for bit
    torch.manual_seed(1234)
    fresh = check_weights(weights, GPT(LM_CONFIG), tolerance=1e-6)
    assert not fresh["passed"] and "blocks.0.mlp.unit.value_proj.weight" in fresh["missing"]
    assert min(r["rel_err"] for r in fresh["rows"] if r["tensor"].endswith("proj.weight")) > 0.5


def test_weight_check_accepts_folded_constant_tensors_only():
    model = torch.nn.Sequential(torch.nn.LayerNorm(4), torch.nn.Linear(4, 3))  # LN: ones and zeros, foldable
    result = check_weights({}, model, tolerance=1e-3)
    assert result["missing"] == ["1.weight", "1.bias"] and result["found"] == 2
    package = {name: p.detach().numpy().astype(np.float16) for name, p in model[1].named_parameters()}
    assert check_weights(package, model, tolerance=1e-3)["passed"]


def test_metadata_names_and_description(exported, checkpoints):
    from sweeplab.export.reference import package_spec

    spec, _ = package_spec(exported("pagating_lm", "fp16").package)
    assert spec.WhichOneof("Type") == "mlProgram" and spec.specificationVersion == 8  # iOS17
    description = spec.description
    assert [f.name for f in description.input] == ["input_ids", "attention_mask"]
    assert [f.name for f in description.output] == ["logits"]
    assert list(description.output[0].type.multiArrayType.shape) == [1, SEQ, LM_VOCAB]
    meta = description.metadata
    assert meta.author == "sweeplab" and meta.versionString == "3" and "pagating_lm" in meta.shortDescription
    user = dict(meta.userDefined)
    assert user["sweeplab.family"] == "pagating_lm" and user["sweeplab.checkpoint"] == str(checkpoints["pagating_lm"])
    assert json.loads(user["sweeplab.config"])["model"]["unit"] == "paGELU"
    alpha = json.loads(user["sweeplab.alpha"])
    assert set(alpha) == {"layer_0", "layer_1"} and all(0 < a < 1 for a in alpha.values())
    assert "sweeplab.metrics" in user and "sweeplab.run_id" in user
    tb_spec, _ = package_spec(exported("textbridge", "fp16").package)
    assert [f.name for f in tb_spec.description.output] == ["embedding"]


def test_masks_are_minus_1e4_never_inf(exported):
    for variant in ("fp16", "ane"):
        constants = load_program(exported("pagating_lm", variant).package).constants()
        assert all(np.isfinite(v).all() for v in constants.values() if v.dtype.kind == "f")
        assert any(v.size == 1 and float(v) == -1e4 for v in constants.values() if v.dtype.kind == "f")


@pytest.mark.parametrize("family", ["textbridge", pytest.param("pagating_lm", marks=pytest.mark.slow)])  # ~9 s
def test_enumerated_shapes(checkpoints, family, tmp_path):
    options = ExportOptions(layout="ane", seq_lens=[8, SEQ], deployment_target="iOS18", n_random=1)
    result = export_checkpoint(checkpoints[family], options, tmp_path)
    assert result.report["status"] == "passed", result.report["failure"]
    cases = [c["case"] for c in result.report["verification"]["reference"]["cases"]]
    assert cases == ["random S=8 #0", f"random S={SEQ} #0"]
    shapes = result.report["interface"]["inputs"]["input_ids"]["enumerated_shapes"]
    assert sorted(shapes) == [[1, 8], [1, SEQ]]


def test_jit_trace_path_exports_too(checkpoints, tmp_path):
    result = export_checkpoint(checkpoints["pagating_lm"], ExportOptions(tracer="jit", n_random=1), tmp_path)
    assert result.report["status"] == "passed" and result.report["conversion"]["tracer"] == "torch.jit.trace"


# --- refusing, atomically ------------------------------------------------------------------------
def test_existing_export_is_kept_unless_overwrite(checkpoints, tmp_path):
    options = ExportOptions(precision="fp32", n_random=1)
    first = export_checkpoint(checkpoints["textbridge"], options, tmp_path)
    stamp = first.report_json.stat().st_mtime_ns
    with pytest.raises(UserError, match="exists; pass export.overwrite=true"):
        export_checkpoint(checkpoints["textbridge"], options, tmp_path)
    assert first.report_json.stat().st_mtime_ns == stamp
    second = export_checkpoint(checkpoints["textbridge"], ExportOptions(precision="fp32", n_random=1, overwrite=True), tmp_path)
    assert second.package == first.package and second.report_json.stat().st_mtime_ns != stamp
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [first.package.name, first.report_json.name, first.report_md.name]
    )


def test_failed_verification_publishes_nothing(checkpoints, tmp_path):
    with pytest.raises(UserError, match=r"verification failed \(rel_err .* > tolerance 1e-12\); nothing published"):
        export_checkpoint(checkpoints["textbridge"], ExportOptions(tolerance=1e-12, n_random=1), tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "textbridge-standard-fp16.coreml.failed-report.json",
        "textbridge-standard-fp16.coreml.failed-report.md",
    ]
    assert "FAILED" in (tmp_path / "textbridge-standard-fp16.coreml.failed-report.md").read_text()
    export_checkpoint(checkpoints["textbridge"], ExportOptions(n_random=1), tmp_path)  # a passing retry cleans up
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([
        "textbridge-standard-fp16.mlpackage",
        "textbridge-standard-fp16.coreml.report.json",
        "textbridge-standard-fp16.coreml.report.md",
    ])


def _cli(monkeypatch, capsys, tmp_path, *args) -> tuple[int, str]:
    from sweeplab.export.__main__ import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["sweeplab.export", *args])
    with pytest.raises(SystemExit) as info:
        main()
    return info.value.code, capsys.readouterr().err


@pytest.fixture
def bad_checkpoints(tmp_path, checkpoints) -> dict[str, Path]:
    truncated = tmp_path / "truncated.ckpt"
    truncated.write_bytes(checkpoints["textbridge"].read_bytes()[:2000])
    foreign = tmp_path / "foreign.ckpt"
    torch.save({"weights": torch.zeros(3)}, foreign)
    return {"truncated": truncated, "foreign": foreign}


@pytest.mark.parametrize(
    "args, message",
    [
        (["ckpt_path=/nonexistent/best.ckpt"], "error: checkpoint /nonexistent/best.ckpt: no such file"),
        (["ckpt_path={truncated}"], "not a readable PyTorch checkpoint"),
        (["ckpt_path={foreign}"], "not a Lightning checkpoint (no state_dict)"),
        (["ckpt_path={textbridge}", "family=pagating_lm"], "holds a textbridge model, expected pagating_lm"),
        (["ckpt_path={textbridge}", "export.precision=fp8"], "error: config error: export.precision: expected 'fp16' | 'fp32', got 'fp8'"),
        (["ckpt_path={pagating_lm}", "export.seq_len=64"], "export.seq_len=64 is longer than the model's block_size=16"),
        (["ckpt_path={textbridge}", "export.real_data={pagating_lm}"], "export.real_data="),
        ([], "nothing to export: give ckpt_path=PATH or run_id=MLFLOW_RUN_ID"),
        (["run_id=abc", "tracking_uri=sqlite:///{tmp}/none.db"], "no MLflow store at sqlite:///"),
    ],
    ids=["missing", "truncated", "foreign", "other-family", "bad-option", "too-long", "bad-real-data", "nothing", "no-store"],
)
def test_cli_errors_are_one_line_exit_2_and_leave_nothing(
    monkeypatch, capsys, tmp_path, checkpoints, bad_checkpoints, args, message
):
    out = tmp_path / "out"
    paths = {**{k: str(v) for k, v in checkpoints.items()}, **{k: str(v) for k, v in bad_checkpoints.items()}}
    args = [a.format(tmp=tmp_path, **paths) for a in args] + [f"out={out}"]
    code, err = _cli(monkeypatch, capsys, tmp_path, *args)
    assert code == 2
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith(("Running MIL", "Converting"))]
    assert lines[-1].startswith("error: ") and message in lines[-1]
    assert "Traceback" not in err
    assert not out.exists() or not any(out.iterdir())
    assert not (tmp_path / "outputs").exists() and not (tmp_path / ".hydra").exists()


@pytest.mark.slow  # a fresh interpreter: ~10 s on a busy 2-core machine; main() is tested in-process above
def test_cli_subprocess_prints_one_line_without_traceback(tmp_path):
    for args, line in [
        (["ckpt_path=/nonexistent.ckpt"], "error: checkpoint /nonexistent.ckpt: no such file"),
        (["ckpt_path=/x.ckpt", "export.precison=fp32"], "error: config error: export.precison: unknown key; accepted:"),
    ]:
        result = subprocess.run(
            [sys.executable, "-m", "sweeplab.export", *args], capture_output=True, text=True, timeout=120, cwd=tmp_path
        )
        assert result.returncode == 2
        (only,) = result.stderr.strip().splitlines()
        assert only.startswith(line)
    assert list(tmp_path.iterdir()) == []  # no outputs/ or .hydra/ either


def test_unknown_keys_are_named_before_hydra_composes():
    from sweeplab.core.errors import ConfigError
    from sweeplab.export.__main__ import check_override_keys

    check_override_keys(["ckpt_path=a", "export.layout=ane", "+export.seq_lens=[8,16]", "hydra.run.dir=x", "family=textbridge"])
    with pytest.raises(ConfigError, match="export.laout: unknown key; accepted: .*layout"):
        check_override_keys(["export.laout=ane"])
    with pytest.raises(ConfigError, match="ckpt: unknown key; accepted: ckpt_path, run_id"):
        check_override_keys(["ckpt=a.ckpt"])


def test_cli_exports_a_checkpoint(monkeypatch, capsys, tmp_path, checkpoints):
    from hydra import compose, initialize_config_dir

    from conftest import CONF_DIR
    from sweeplab.export.__main__ import run

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("export_model", [f"ckpt_path={checkpoints['textbridge']}", "export.layout=ane", "export.n_random=1"])
    package = run(cfg)
    assert package == checkpoints["textbridge"].parent.parent / "export" / "textbridge-ane-fp16.mlpackage"
    assert capsys.readouterr().out.strip() == f"report: {package.with_name('textbridge-ane-fp16.coreml.report.md')}"


# --- MLflow --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    """One sqlite store for the module's MLflow tests (creating its schema takes seconds)."""
    import contextlib

    from sweeplab.tracking.mlflow_store import init_store

    directory = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{directory / 'mlflow.db'}"
    with contextlib.chdir(directory):  # a new experiment's artifacts go under the working directory: not the checkout
        init_store(uri, "sweeplab")
    return uri


def _run_with_checkpoint(uri: str, checkpoint: Path | None) -> str:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    tags = {"checkpoint": str(checkpoint)} if checkpoint else {}
    run = client.create_run(client.get_experiment_by_name("sweeplab").experiment_id, tags=tags)
    client.log_metric(run.info.run_id, "val/cos", 0.75)
    client.log_metric(run.info.run_id, "train/loss", 1.5)
    return run.info.run_id


def test_run_id_export_logs_package_and_report(monkeypatch, capsys, store, checkpoints, tmp_path):
    from mlflow.tracking import MlflowClient

    from sweeplab.export.reference import package_spec

    run_id = _run_with_checkpoint(store, checkpoints["pagating_lm"])
    from sweeplab.export.__main__ import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(
        sys, "argv",
        ["sweeplab.export", f"run_id={run_id}", f"tracking_uri={store}", f"out={tmp_path / 'pkg'}", "export.n_random=1"],
    )
    main()  # returns normally: no SystemExit
    client = MlflowClient(store)
    logged = {a.path for a in client.list_artifacts(run_id, "coreml")}
    name = "pagating_lm-standard-fp16"
    assert {f"coreml/{name}.mlpackage", f"coreml/{name}.coreml.report.json", f"coreml/{name}.coreml.report.md"} <= logged
    assert f"coreml/{name}.mlpackage/Manifest.json" in {
        a.path for a in client.list_artifacts(run_id, f"coreml/{name}.mlpackage")
    }
    metrics = client.get_run(run_id).data.metrics
    assert metrics["export/standard-fp16/rel_err"] <= 1e-2 and metrics["export/standard-fp16/package_mb"] > 0
    # the readiness report: an artifact and metrics (the LM's embedding gather leaves the Neural Engine)
    assert f"coreml/{name}.readiness.json" in logged
    assert 0 < metrics["export/standard-fp16/ane_unready_work_share"] < 1
    assert metrics["export/standard-fp16/fp16_overflow_tensors"] == 0 and metrics["export/standard-fp16/ane_blockers"] == 2
    # ... and the sweep report shows them beside the run's speed and quality: a column and the verdict line
    from sweeplab.report.tables import write_report

    run = client.get_run(run_id)
    verdict = run.data.tags["export/standard-fp16/ane_verdict"]
    assert verdict.startswith("blockers: ") and "gather" in verdict
    shown = write_report(sweep_from_runs(None, [run]), None, "exports")
    share = metrics["export/standard-fp16/ane_unready_work_share"]
    assert shown.rows[0]["ANE readiness"] == f"standard-fp16: 2 blockers, {share:.1%} of work off the ANE"
    assert f"standard-fp16: {verdict}" in shown.markdown
    user = dict(package_spec(tmp_path / "pkg" / f"{name}.mlpackage")[0].description.metadata.userDefined)
    assert user["sweeplab.run_id"] == run_id and json.loads(user["sweeplab.metrics"]) == {"val/cos": 0.75}


def test_export_after_training(store, checkpoints, tmp_path):
    from mlflow.tracking import MlflowClient

    run_id = _run_with_checkpoint(store, checkpoints["textbridge"])
    assert export_after_training({"format": "none"}, str(checkpoints["textbridge"]), tmp_path, run_id, store) is None
    assert export_after_training(None, str(checkpoints["textbridge"]), tmp_path, run_id, store) is None
    package = export_after_training(
        {"format": "coreml", "layout": "ane", "n_random": 1}, str(checkpoints["textbridge"]), tmp_path / "export",
        run_id, store,
    )
    assert package == tmp_path / "export" / "textbridge-ane-fp16.mlpackage" and package.is_dir()
    logged = {a.path for a in MlflowClient(store).list_artifacts(run_id, "coreml")}
    assert "coreml/textbridge-ane-fp16.coreml.report.md" in logged


def test_run_without_checkpoint_tag_or_unknown_run_is_refused(store):
    from sweeplab.export import checkpoint_from_run

    with pytest.raises(UserError, match="has no `checkpoint` tag"):
        checkpoint_from_run(_run_with_checkpoint(store, None), store)
    with pytest.raises(UserError, match="run_id=0123456789abcdef: not found"):
        checkpoint_from_run("0123456789abcdef", store)


# --- the training app's smoke checkpoints, every variant (slow: two smoke trainings) --------------
@pytest.mark.slow
def test_smoke_trained_checkpoints_export_in_every_variant(demo_dir, mlflow_uri, tmp_path):
    from mlflow.tracking import MlflowClient
    from omegaconf import open_dict

    from conftest import compose_train, smoke_config
    from sweeplab.engine.training import train

    configs = {
        "textbridge": smoke_config(demo_dir, "model.max_len=32"),
        "pagating_lm": compose_train(
            ["model=pagating_lm", "debug=smoke", f"paths.data_dir={tmp_path / 'data'}", "model.block_size=32"]
        ),
    }
    client = MlflowClient(mlflow_uri)
    for family, cfg in configs.items():
        with open_dict(cfg):
            cfg.trainer.enable_progress_bar = False
        train(cfg)
        (run,) = [r for r in client.search_runs([e.experiment_id for e in client.search_experiments()])
                  if r.data.tags.get("family") == family]
        checkpoint = run.data.tags["checkpoint"]
        real = demo_dir if family == "textbridge" else next((tmp_path / "data" / "lm_cache").glob("valid-*.bin"))
        for values in VARIANTS.values():
            package = export_after_training(
                {"format": "coreml", **values, "real_data": str(real)}, checkpoint, tmp_path / family,
                run.info.run_id, mlflow_uri,
            )
            report = json.loads(package.with_name(package.name.replace(".mlpackage", ".coreml.report.json")).read_text())
            reference = report["verification"]["reference"]
            assert report["status"] == "passed" and reference["passed"], report["failure"]
            print(f"\nsmoke {family} {report['variant']}: rel_err {reference['rel_err']:.2e} "
                  f"max_abs {reference['max_abs_err']:.2e} size {report['weights']['package_bytes'] / 1e3:.1f} kB")


def test_export_without_a_checkpoint_offers_the_latest_sweeps_best_run(mlflow_uri, tmp_path):
    """`make export` with no argument names the latest sweep's best run and the command that exports it."""
    from mlflow.tracking import MlflowClient

    from test_report_figures import recorded_sweep, synthetic_jobs

    parent = recorded_sweep(mlflow_uri, synthetic_jobs(replicates=1))
    client = MlflowClient(mlflow_uri)
    best = client.search_runs([client.get_run(parent).info.experiment_id],
                              filter_string=f"tags.mlflow.parentRunId = '{parent}'")[0].info.run_id
    client.set_tag(parent, "best_run_id", best)
    result = subprocess.run([sys.executable, "-m", "sweeplab.export"], capture_output=True, text=True, timeout=300,
                            cwd=tmp_path, env={**os.environ, "MLFLOW_TRACKING_URI": mlflow_uri})
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("error: nothing to export: give ckpt_path=PATH or run_id=MLFLOW_RUN_ID; ")
    assert f'the latest sweep\'s best run: make export ARGS="run_id={best}"' in result.stderr
