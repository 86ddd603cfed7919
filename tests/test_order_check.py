"""`python -m sweeplab.order_check`: a sweep's jobs in their order and reversed, each order one `train -m` process."""

from __future__ import annotations

import itertools
import statistics
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
    assert order_check.main(["data.batch_size=8,16", "--rounds", "0"]) == 2
    assert capsys.readouterr().err == "error: --rounds must be at least 1, got 0\n"


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


def _number(cell: str) -> float:
    return float(cell.replace(",", ""))


def _assert_both_orders(done, markdown: str, configs: list[str], rounds: int = 1) -> None:
    assert done.returncode in (0, 1), done.stderr[-2000:]  # 1: a ratio outside ±5 %, likely on a shared CPU
    rows = _rows(markdown)
    assert [r[0] for r in rows] == configs
    n = len(configs)
    for position, row in enumerate(rows, start=1):
        if rounds > 1:  # every run of each order, and the largest spread between runs of one order
            runs, run_to_run = row.pop(6), row.pop(6)
            forward_runs, reversed_runs = ([_number(x) for x in side.split()] for side in runs.split(";"))
            assert len(forward_runs) == len(reversed_runs) == rounds
            assert _number(row[2]) == pytest.approx(statistics.median(forward_runs), rel=0.01)
            assert _number(row[4]) == pytest.approx(statistics.median(reversed_runs), rel=0.01)
            worst = max(max(r) / min(r) - 1 for r in (forward_runs, reversed_runs))
            assert float(run_to_run.rstrip("%")) / 100 == pytest.approx(worst, abs=0.002)
        _, fwd_job, fwd_rate, rev_job, rev_rate, ratio, verdict, _ = row
        assert (int(fwd_job), int(rev_job)) == (position, n + 1 - position)
        assert float(ratio) == pytest.approx(_number(rev_rate) / _number(fwd_rate), rel=0.01)
        assert verdict == "ok" or verdict.startswith("differs by more than ±5%")
    assert "every configuration within ±5%" in markdown or f"of {n} configurations differ" in markdown
    assert done.returncode == (0 if "every configuration within" in markdown else 1)


@pytest.mark.slow  # four `train -m` processes: ~2 min on a busy 2-core machine
def test_the_order_check_runs_a_textbridge_sweep_end_to_end(demo_dir, mlflow_uri, tmp_path):
    done, markdown = _check(tmp_path, f"data.path={demo_dir}", "model.out_dim=64", "data.batch_size=8,16", "--rounds", "2")
    _assert_both_orders(done, markdown, ["batch_size=8", "batch_size=16"], rounds=2)
    logs = sorted(p.name for p in (tmp_path / "check").glob("*.log"))
    assert logs == ["forward_1.log", "forward_2.log", "reversed_1.log", "reversed_2.log"]


def test_rounds_are_counterbalanced_and_compared_by_their_medians():
    """Rounds run F R R F F R: a machine drifting over the check's minutes weighs on both orders alike. Each
    order's samples/s is the median of its runs; the verdict is the medians' ratio, and `run to run` the largest
    spread between runs of one order (here reversed: 90 against 99, 10 %)."""
    assert order_check.passes(1) == [("forward", 1), ("reversed", 1)]
    assert order_check.passes(3) == [("forward", 1), ("reversed", 1), ("reversed", 2), ("forward", 2),
                                     ("forward", 3), ("reversed", 3)]
    config = ("16",)

    def run(rate):
        return {config: {"position": 1, "rate": rate, "problems": [], "status": "FINISHED"}}

    by_pass = {("forward", 1): run(100.0), ("reversed", 1): run(90.0), ("reversed", 2): run(97.0),
               ("forward", 2): run(104.0), ("forward", 3): run(101.0), ("reversed", 3): run(99.0)}
    rows, bad = order_check.table(["data.batch_size"], by_pass)
    assert rows[0]["forward samples/s"] == "101" and rows[0]["reversed samples/s"] == "97"
    assert rows[0]["reversed / forward"] == "0.960" and rows[0]["verdict"] == "ok" and bad == 0
    assert rows[0]["run to run"] == "10.0%" and rows[0]["runs (forward; reversed)"] == "100 104 101; 90 97 99"
    by_pass[("reversed", 1)], by_pass[("reversed", 3)] = run(80.0), run(86.0)  # 0.851: outside ±5 %, yet the
    rows, bad = order_check.table(["data.batch_size"], by_pass)  # reversed runs alone spread 21 %: the verdict says so
    assert bad == 1 and rows[0]["reversed / forward"] == "0.851"
    assert rows[0]["verdict"] == "differs by more than ±5% (inside the run-to-run spread of 21%)"
    by_pass[("reversed", 2)] = {config: {"position": 1, "rate": None, "problems": [], "status": "FAILED"}}
    rows, bad = order_check.table(["data.batch_size"], by_pass)  # a failed run is not hidden by the others
    assert bad == 1 and rows[0]["reversed samples/s"] == "FAILED"


@pytest.mark.slow
def test_the_order_check_runs_an_lm_batch_sweep_end_to_end(mlflow_uri, tmp_path):
    done, markdown = _check(tmp_path, "model=pagating_lm", f"data.cache_dir={tmp_path / 'lm'}", "data.batch_size=2,4")
    _assert_both_orders(done, markdown, ["batch_size=2", "batch_size=4"])
