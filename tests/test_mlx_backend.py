"""backend=mlx: the same job as backend=cpu, trained by sweeplab's own MLX loop, recorded the same way."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from mlflow.tracking import MlflowClient

from conftest import compose_train, smoke_config
from sweeplab.core.errors import ConfigError
from sweeplab.engine.plan import plan
from sweeplab.engine.training import train
from sweeplab.families.loading import load_model
from sweeplab.tasks.checkpoint import CHECKSUM_ALGORITHM, CHECKSUM_KEY

pytest.importorskip("mlx.core", reason="mlx is not installed (pip install 'sweeplab[mlx]')")

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")


def runs_by_backend(uri: str) -> dict:
    client = MlflowClient(uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    return {r.data.tags.get("backend"): r for r in runs if r.data.tags.get("backend")}


def history(uri: str, run, key: str) -> list[tuple[int, float]]:
    return [(m.step, m.value) for m in sorted(MlflowClient(uri).get_metric_history(run.info.run_id, key), key=lambda m: m.step)]


def test_an_mlx_run_matches_the_cpu_run_and_is_recorded_the_same_way(demo_dir, mlflow_uri):
    for backend in ("cpu", "mlx"):
        train(smoke_config(demo_dir, f"backend={backend}", "logger.system_metrics_after_s=null"))
    runs = runs_by_backend(mlflow_uri)
    cpu, mlx = runs["cpu"], runs["mlx"]
    assert mlx.info.status == "FINISHED"
    assert mlx.data.tags["mlx"] and mlx.data.tags["device"].startswith("MLX cpu")
    # the same metric names (Lightning's own `epoch` counter aside) at the same steps
    assert set(cpu.data.metrics) - {"epoch"} == set(mlx.data.metrics)
    for key in ("train/loss", "val/cos", "val/loss", "lr", "train/step_time_s"):
        assert [s for s, _ in history(mlflow_uri, cpu, key)] == [s for s, _ in history(mlflow_uri, mlx, key)], key
    # the same numbers: same initial weights, data order, optimizer and schedule
    for key in ("train/loss", "val/cos", "val/mse", "lr"):
        assert [v for _, v in history(mlflow_uri, mlx, key)] == pytest.approx(
            [v for _, v in history(mlflow_uri, cpu, key)], rel=1e-4
        ), key
    # the best checkpoint is a PyTorch checkpoint of the trained MLX weights: export and report read it
    loaded = load_model(mlx.data.tags["checkpoint"], expect_family="textbridge")
    reference = load_model(cpu.data.tags["checkpoint"], expect_family="textbridge")
    assert loaded.global_step == reference.global_step
    for (name, a), (_, b) in zip(loaded.model.state_dict().items(), reference.model.state_dict().items()):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-5, msg=name)
    for run in (cpu, mlx):  # both loops save through one writer, which adds the checksum load_model checked
        assert torch.load(run.data.tags["checkpoint"], weights_only=True)[CHECKSUM_KEY]["algorithm"] == CHECKSUM_ALGORITHM


@pytest.mark.slow  # ~15-55 s: a paGating run on MLX and on the CPU (fast sibling: the TextBridge one above)
def test_the_lm_logs_alpha_as_the_lightning_path_does(demo_dir, mlflow_uri):
    overrides = ["model=pagating_lm", "debug=smoke", "model.alpha=cosine", "logger.system_metrics_after_s=null",
                 "trainer.max_steps=6", "trainer.val_check_interval=3", "trainer.log_every_n_steps=2",
                 "trainer.limit_val_batches=2"]
    for backend in ("cpu", "mlx"):
        cfg = compose_train([*overrides, f"backend={backend}"])
        train(cfg)
    runs = runs_by_backend(mlflow_uri)
    for key in ("alpha/layer_0", "train/loss", "val/ppl"):
        cpu, mlx = history(mlflow_uri, runs["cpu"], key), history(mlflow_uri, runs["mlx"], key)
        assert [s for s, _ in cpu] == [s for s, _ in mlx], key
        assert [v for _, v in mlx] == pytest.approx([v for _, v in cpu], rel=1e-3), key


@pytest.mark.parametrize(
    "override,key",
    [
        ("compile=default", "compile"),
        ("cuda_graph=true", "cuda_graph"),
        ("trainer.precision=16-mixed", "trainer.precision"),
        ("trainer.precision=bf16-true", "trainer.precision"),
        ("trainer.devices=2", "trainer.devices"),
        ("optim.implementation=fused", "optim.implementation"),
        ("backend.device=gpu", "backend.device"),
    ],
)
def test_what_mlx_cannot_do_is_refused_naming_the_key(demo_dir, override, key):
    with pytest.raises(ConfigError) as error:
        plan(smoke_config(demo_dir, "backend=mlx", override))  # plan() applies the MLX loop's rules too
    assert error.value.key == key
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("override", ["trainer.precision=bf16-mixed", "trainer.accumulate_grad_batches=2", "resume=true"])
def test_what_mlx_no_longer_refuses_plans(demo_dir, override):
    assert plan(smoke_config(demo_dir, "backend=mlx", override)).backend == "mlx"


FAMILY_RUNS = {  # overrides of a short run of each family, on the demo data (the LM: its own corpus)
    "textbridge": ["model.out_dim=64", "data.batch_size=16"],
    "pagating_lm": ["model=pagating_lm"],
    "textbridge_decoder": ["model=textbridge_decoder", "data.batch_size=16"],
}


@pytest.mark.parametrize("family", [  # the decoder's validations decode greedily: ~2 min on 2 busy cores
    "textbridge", pytest.param("pagating_lm", marks=pytest.mark.slow), pytest.param("textbridge_decoder", marks=pytest.mark.slow),
])
def test_bf16_mixed_mlx_runs_follow_the_cpu_bf16_mixed_run(family, demo_dir, mlflow_uri, monkeypatch, tmp_path):
    """The loop with trainer.precision=bf16-mixed, against Lightning's CPU autocast run of the same job: the same
    steps logged, the losses within test_mlx_parity's BF16_CURVE_TOLERANCE (bfloat16 rounds in other places there)."""
    from test_mlx_parity import BF16_CURVE_TOLERANCE

    monkeypatch.setenv("SWEEPLAB_DATA_DIR", str(tmp_path / "data"))
    data = [] if family == "pagating_lm" else [f"data.path={demo_dir}"]
    overrides = ["debug=smoke", *data, "trainer.precision=bf16-mixed",
                 "trainer.max_steps=6", "trainer.val_check_interval=3", "trainer.log_every_n_steps=1",
                 "logger.system_metrics_after_s=null", "trainer.enable_progress_bar=false", *FAMILY_RUNS[family]]
    for backend in ("cpu", "mlx"):
        train(compose_train([*overrides, f"backend={backend}"]))
    runs = runs_by_backend(mlflow_uri)
    assert runs["mlx"].data.tags["precision"] == "bf16-mixed"
    assert set(runs["cpu"].data.metrics) - {"epoch"} == set(runs["mlx"].data.metrics)  # the decoder's val/chrf too
    for key in ("train/loss", "val/loss"):
        cpu, mlx = history(mlflow_uri, runs["cpu"], key), history(mlflow_uri, runs["mlx"], key)
        assert [s for s, _ in cpu] == [s for s, _ in mlx], key
        assert [v for _, v in mlx] == pytest.approx([v for _, v in cpu], rel=BF16_CURVE_TOLERANCE), key


def test_without_the_mlx_package_backend_mlx_says_how_to_install_it(demo_dir, tmp_path):
    # a real interpreter in which `import mlx` fails, as on a machine without the package
    script = (
        "import sys; sys.modules['mlx'] = None; sys.modules['mlx.core'] = None\n"
        "from sweeplab.train import main; sys.argv = ['train', 'debug=smoke', 'backend=mlx', 'logger=none',"
        f" 'data.path={demo_dir}', 'model.out_dim=64', 'hydra.run.dir={tmp_path}']; main()\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=300,
        env={**os.environ, "PYTHONPATH": SRC},
    )
    assert result.returncode == 2, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == ["error: backend=mlx: the mlx package is not installed; pip install 'sweeplab[mlx]'"], result.stderr[-2000:]


@pytest.mark.slow
def test_a_sweep_over_cpu_and_mlx_gives_two_comparable_runs_under_one_parent_and_one_report(demo_dir, mlflow_uri, tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "sweeplab.train", "-m", "debug=smoke", "backend=cpu,mlx", f"data.path={demo_dir}",
         "model.out_dim=64", f"hydra.sweep.dir={tmp_path / 'sweep'}"],
        capture_output=True, text=True, cwd=tmp_path, timeout=600, env={**os.environ, "PYTHONPATH": SRC},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    runs = runs_by_backend(mlflow_uri)
    assert set(runs) == {"cpu", "mlx"}
    parents = {r.data.tags.get("mlflow.parentRunId") for r in runs.values()}
    assert len(parents) == 1 and None not in parents
    report = (tmp_path / "sweep" / "report.md").read_text()
    rows = [line for line in report.splitlines() if line.startswith("| textbridge")]
    assert len(rows) == 2 and any(" mlx " in row for row in rows) and any(" cpu " in row for row in rows)
    assert [v for _, v in history(mlflow_uri, runs["mlx"], "val/cos")] == pytest.approx(
        [v for _, v in history(mlflow_uri, runs["cpu"], "val/cos")], rel=1e-4
    )



@pytest.mark.slow  # two runs, ~25 s on a busy 2-core host
def test_with_accumulation_mlx_validates_the_weights_lightning_reaches(demo_dir, mlflow_uri):
    """trainer.accumulate_grad_batches=2 on both loops: at the steps both validate, the same val/cos (the same
    weights). Lightning counts val_check_interval in batches under accumulation (validating every 2 optimizer steps
    here), the MLX loop in optimizer steps, as docs/metrics.md says; Lightning logs the last batch's train/loss,
    the MLX loop the mean of the step's batches."""
    for backend in ("cpu", "mlx"):
        train(smoke_config(demo_dir, f"backend={backend}", "trainer.max_steps=10", "trainer.val_check_interval=4",
                           "trainer.accumulate_grad_batches=2", "logger.system_metrics_after_s=null"))
    runs = runs_by_backend(mlflow_uri)
    cpu, mlx = (dict(history(mlflow_uri, runs[b], "val/cos")) for b in ("cpu", "mlx"))
    assert sorted(mlx) == [3, 7, 9] and set(mlx) <= set(cpu)
    assert [mlx[s] for s in sorted(mlx)] == pytest.approx([cpu[s] for s in sorted(mlx)], rel=1e-4)
