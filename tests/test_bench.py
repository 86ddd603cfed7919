"""The bench's raw loop is the same training as a sweeplab job (same weights after the same steps), and a bench row
records both sides, the overhead and the MLflow runs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient

from conftest import compose_train
from sweeplab import bench
from sweeplab.engine.training import train

SMOKE = ["debug=smoke", "model.out_dim=64", "data.batch_size=16", "trainer.enable_progress_bar=false"]


def _smoke(demo_dir: Path, *extra: str) -> list[str]:
    return [*SMOKE, f"data.path={demo_dir}", *extra]


@pytest.mark.parametrize("model", ["textbridge", "pagating_lm"])
def test_raw_loop_trains_exactly_like_the_sweeplab_job(model, demo_dir, mlflow_uri, tmp_path):
    """Same init, data order, optimizer, schedule and clipping: the weights agree after 8 steps."""
    extra = ["model=pagating_lm", "data.path=null", f"data.cache_dir={tmp_path / 'lm'}"] if model == "pagating_lm" else []
    overrides = [*_smoke(demo_dir), *extra, "trainer.max_steps=8", "trainer.val_check_interval=8", "optim.grad_clip=0.05"]
    if model == "pagating_lm":
        overrides = [o for o in overrides if o not in ("model.out_dim=64",) and not o.startswith("data.path=/")]
    cfg = compose_train(overrides)
    train(cfg)
    (ckpt,) = (Path.cwd() / "outputs" / "checkpoints").glob("best-step*.ckpt")
    trained = torch.load(ckpt, map_location="cpu", weights_only=True)["state_dict"]

    raw = bench.RawLoop(cfg)
    for _ in range(2):  # every run starts where a job starts: the second one trains exactly like the first
        raw.run(warmup_steps=0, steps=8)
        for name, value in raw.model.state_dict().items():
            torch.testing.assert_close(value, trained[f"model.{name}"], rtol=1e-4, atol=1e-5, msg=name)
        assert raw.scheduler.last_epoch == 8


def test_a_bench_row_records_both_sides_and_the_overhead(demo_dir, mlflow_uri, tmp_path, monkeypatch):
    """A real row, run while the OS reports a load of 40 (the reading mocked, not the rule): its status says so, as
    the report's stability column does."""
    import os

    monkeypatch.setattr(os, "getloadavg", lambda: (40.0, 40.0, 40.0))
    settings = bench.BenchSettings(rows=[], warmup_steps=2, steps=6, repeats=2, experiment_name="bench-test")
    row = bench.BenchRow(name="smoke row", overrides=_smoke(demo_dir), role="cpu")
    cfg = bench.row_config(row, settings, [], [], None)
    assert cfg.trainer.max_steps == 8 and cfg.timing.warmup_steps == 2 and "bench" not in cfg

    from sweeplab.tracking import mlflow_store

    experiment_id = mlflow_store.init_store(mlflow_uri, "bench-test")
    client = MlflowClient(mlflow_uri)
    parent = client.create_run(experiment_id, tags={"sweeplab.role": "sweep"}).info.run_id
    result = bench.run_row(row, cfg, settings, mlflow_uri, parent)

    assert len(result.sweeplab) == len(result.raw) == 2 and len(result.pair_overheads) == 2
    assert 0.1 < result.overhead < 10
    children = client.search_runs([experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent}'")
    assert len(children) == 2
    for run in children:
        assert run.data.tags["bench.row"] == "smoke row"
        assert {"bench/raw_samples_per_sec", "bench/overhead", "summary/samples_per_sec"} <= set(run.data.metrics)

    rows = bench.table_rows([result, bench.RowResult(bench.BenchRow("gpu row", []), cfg, skipped="skipped: no accelerator")])
    assert rows[0]["speedup"] == "1.00×" and rows[0]["overhead"]
    assert f"loaded host (load 40.0 on {os.cpu_count()} CPUs)" in rows[0]["status"], rows[0]["status"]
    assert all(r["summary/load_avg_start"] == 40.0 for r in result.sweeplab)
    assert rows[1]["status"] == "skipped: no accelerator" and rows[1]["samples/s"] == ""
    markdown = bench.render([result], settings, "python -m sweeplab.bench")
    assert "| smoke row |" in markdown and "overhead" in markdown
    assert all(r["summary/compiles_in_timed_steps"] == 0 for r in result.sweeplab) and all(r["compiles"] == 0 for r in result.raw)

    recompiled = bench.RowResult(row, cfg, sweeplab=[{"summary/samples_per_sec": 9.0, "summary/compiles_in_timed_steps": 2.0}],
                                 raw=[{"samples_per_sec": 10.0, "compiles": 0}])
    assert bench.table_rows([recompiled])[0]["status"] == (
        "compiled during timing (sweeplab 2, raw 0); no noise estimate (1 pair): raise bench.repeats")
    noisy = bench.RowResult(row, cfg, sweeplab=[{"summary/samples_per_sec": v} for v in (9.0, 12.0, 10.0)],
                            raw=[{"samples_per_sec": 10.0}] * 3)
    assert bench.table_rows([noisy])[0]["status"] == "noisy: pairs 0.90-1.20, raise bench.repeats"
    for m, spread in zip(noisy.sweeplab, (0.1, 0.8, None)):
        m["summary/host_speed_spread"] = spread
    assert bench.table_rows([noisy])[0]["status"] == (
        "noisy: pairs 0.90-1.20, raise bench.repeats; unsteady host (Python speed spread 80% > 50%)"
    )


def test_one_pair_does_not_read_ok(demo_dir):
    """One sweeplab/raw pair gives no estimate of the machine's noise: its overhead is not called ok (the loaded host
    is test_a_bench_row_records_both_sides_and_the_overhead's, through a real row)."""
    row = bench.BenchRow(name="one pair", overrides=[], role="cpu")
    quiet = {"summary/samples_per_sec": 10.0, "summary/load_avg_start": 0.1, "summary/host_cpus": 2.0,
             "summary/step_time_spread": 0.01, "summary/batch_shapes": 1.0}
    one = bench.RowResult(row, None, sweeplab=[dict(quiet)], raw=[{"samples_per_sec": 10.0}])
    assert bench.table_rows([one])[0]["status"] == "no noise estimate (1 pair): raise bench.repeats"
    two = bench.RowResult(row, None, sweeplab=[dict(quiet), dict(quiet)], raw=[{"samples_per_sec": 10.0}] * 2)
    assert bench.table_rows([two])[0]["status"] == "ok"  # two close pairs on a quiet host: the only ok here


@pytest.mark.slow  # the default suite's time budget; `make test-all` runs it
def test_presets_compose_and_every_row_plans(tmp_path):
    for experiment in ("experiment=bench", "experiment=bench_h100"):
        settings, exp, _ = bench.load_settings([experiment])
        assert len(settings.rows) >= 6 and {r.role for r in settings.rows} == {"cpu", "accelerator"}
        for row in settings.rows:
            cfg = bench.row_config(row, settings, exp, [f"paths.data_dir={tmp_path}"], None)
            assert cfg.trainer.val_check_interval == cfg.trainer.max_steps


def test_the_host_preset_runs_one_and_four_steps_per_batch(tmp_path):
    from sweeplab.engine.plan import plan

    settings, exp, _ = bench.load_settings(["experiment=bench_host"])
    plans = [plan(bench.row_config(row, settings, exp, [f"paths.data_dir={tmp_path}"], None)) for row in settings.rows]
    assert [p.steps_per_batch for p in plans] == [1, 4]
    assert all(p.backend == "cpu" and p.datamodule.steps_per_batch == p.steps_per_batch for p in plans)


def test_tiled_textbridge_data(demo_dir, tmp_path):
    from sweeplab.families.textbridge.bench import tiled_textbridge_data
    from sweeplab.families.textbridge.formats import open_dataset

    out = tiled_textbridge_data(demo_dir, tmp_path, 1000)
    data = open_dataset(out)
    demo = open_dataset(demo_dir / "demo.efb1")
    assert len(data) == 1000 and (out / "tokenizer.json").exists()
    assert (data[len(demo)].input_ids == demo[0].input_ids).all()
