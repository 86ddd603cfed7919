"""`python -m sweeplab.order_check`: a sweep's jobs in their order and reversed, each order one `train -m` process."""

from __future__ import annotations

import itertools
import subprocess
import sys

import pytest

from sweeplab import order_check


def _jobs(overrides: list[str]) -> list[tuple[str, ...]]:
    """The jobs Hydra's basic sweeper runs, in order: the product of the swept lists as written."""
    lists = [o.split("=", 1)[1].split(",") for o in overrides if "," in o]
    return list(itertools.product(*lists))


def test_the_reversed_order_runs_the_default_sweeps_jobs_backwards(tmp_path):
    swept, fixed = order_check.swept_values(["sweep=default", "backend=cpu", "loss.beta=0.3,0.5,0.7"])
    assert swept == {"data.batch_size": ["32", "64"], "loss.alpha": ["1.0", "0.7"], "loss.beta": ["0.3", "0.5", "0.7"]}
    assert fixed == ["sweep=default", "backend=cpu"]
    forward = order_check.pass_overrides(swept, fixed, "forward", tmp_path / "f")
    backward = order_check.pass_overrides(swept, fixed, "reversed", tmp_path / "r")
    assert "hydra/launcher=basic" in backward and f"hydra.sweep.dir={tmp_path / 'r'}" in backward
    assert len(_jobs(forward)) == 12 and _jobs(backward) == _jobs(forward)[::-1]


def test_the_lm_batch_sweep_and_a_launcher_override(tmp_path):
    swept, fixed = order_check.swept_values(["model=pagating_lm", "sweep=pagating_batch", "hydra/launcher=joblib_gpus"])
    assert swept == {"data.batch_size": ["4", "8", "16", "32"]} and fixed == ["model=pagating_lm", "sweep=pagating_batch"]
    backward = order_check.pass_overrides(swept, fixed, "reversed", tmp_path)
    assert "data.batch_size=32,16,8,4" in backward and "hydra/launcher=joblib_gpus" not in backward


def test_nothing_swept_is_one_line(capsys):
    assert order_check.main(["debug=smoke"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: nothing is swept") and err.count("\n") == 1


def _check(tmp_path, *overrides: str) -> tuple[subprocess.CompletedProcess, str]:
    out = tmp_path / "check"
    done = subprocess.run(
        [sys.executable, "-m", "sweeplab.order_check", "debug=smoke", "trainer.max_steps=12", "trainer.val_check_interval=12",
         *overrides, "--out", str(out)],
        capture_output=True, text=True, timeout=600,
    )
    return done, (out / "order_check.md").read_text() if (out / "order_check.md").exists() else ""


def _rows(markdown: str) -> list[list[str]]:
    lines = [line for line in markdown.splitlines() if line.startswith("| ") and not line.startswith("| configuration")]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]


def _assert_both_orders(done, markdown: str, configs: list[str], repeat: bool = False) -> None:
    assert done.returncode in (0, 1), done.stderr[-2000:]  # 1: a ratio outside ±5 %, likely on a shared CPU
    rows = _rows(markdown)
    assert [r[0] for r in rows] == configs
    n = len(configs)
    for position, row in enumerate(rows, start=1):
        if repeat:  # the forward order's second run, and its ratio to the first
            again_rate, again_ratio = row.pop(6), row.pop(6)
            assert float(again_ratio) == pytest.approx(float(again_rate) / float(row[2]), rel=0.01)
        _, fwd_job, fwd_rate, rev_job, rev_rate, ratio, verdict, _ = row
        assert (int(fwd_job), int(rev_job)) == (position, n + 1 - position)
        assert float(ratio) == pytest.approx(float(rev_rate) / float(fwd_rate), rel=0.01)
        assert verdict == "ok" or verdict.startswith("differs by more than ±5%")
    assert "every configuration within ±5%" in markdown or f"of {n} configurations differ" in markdown
    assert done.returncode == (0 if "every configuration within" in markdown else 1)


@pytest.mark.slow  # three `train -m` processes: ~90 s on a busy 2-core machine
def test_the_order_check_runs_a_textbridge_sweep_end_to_end(demo_dir, mlflow_uri, tmp_path):
    done, markdown = _check(tmp_path, f"data.path={demo_dir}", "model.out_dim=64", "data.batch_size=8,16", "--repeat")
    _assert_both_orders(done, markdown, ["batch_size=8", "batch_size=16"], repeat=True)
    assert (tmp_path / "check" / "forward_again").is_dir()


def test_repeat_adds_the_run_to_run_ratio_and_keeps_the_order_verdict(tmp_path):
    """The forward order's second run says how far a job moves with nothing changed; the verdict is still the
    order ratio's (here 0.90: outside ±5 %, though the run-to-run ratio is 0.88)."""
    config = ("16",)
    by_order = {
        "forward": {config: {"position": 1, "rate": 100.0, "problems": [], "status": "FINISHED"}},
        "reversed": {config: {"position": 1, "rate": 90.0, "problems": [], "status": "FINISHED"}},
        order_check.REPEAT: {config: {"position": 1, "rate": 88.0, "problems": [], "status": "FINISHED"}},
    }
    rows, bad = order_check.table(["data.batch_size"], by_order)
    assert bad == 1 and rows[0]["again / forward"] == "0.880" and rows[0]["forward again samples/s"] == "88"
    assert rows[0]["verdict"].startswith("differs by more than ±5%")
    swept, fixed = order_check.swept_values(["debug=smoke", "data.batch_size=8,16"])
    again = order_check.pass_overrides(swept, fixed, order_check.REPEAT, tmp_path)
    assert "data.batch_size=8,16" in again  # the forward order again


@pytest.mark.slow
def test_the_order_check_runs_an_lm_batch_sweep_end_to_end(mlflow_uri, tmp_path):
    done, markdown = _check(tmp_path, "model=pagating_lm", f"data.cache_dir={tmp_path / 'lm'}", "data.batch_size=2,4")
    _assert_both_orders(done, markdown, ["batch_size=2", "batch_size=4"])
