"""The measurement scripts the docs quote still run against the current package (they are not imported by it)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import smoke_config
from sweeplab.engine.training import train

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


@pytest.mark.slow  # ~15 s: a short training run, then the script in a subprocess
def test_textbridge_quality_reports_the_split_the_floor_and_retrieval(demo_dir, mlflow_uri, tmp_path):
    train(smoke_config(demo_dir, "trainer.max_steps=4", "trainer.val_check_interval=4"))
    ckpt = Path.cwd() / "outputs" / "checkpoints" / "last.ckpt"
    result = subprocess.run([sys.executable, str(SCRIPTS / "textbridge_quality.py"), str(ckpt), "--data", str(demo_dir)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert figures["global_step"] == 4 and figures["n_train"] + figures["n_val"] == 300
    assert -1 <= figures["mean_target_floor"] <= 1 and 0 < figures["val_mrr"] <= 1
    assert figures["val_cos_above_floor"] == round(figures["val_cos"] - figures["mean_target_floor"], 4)


def _verdict_simulation():
    sys.path.insert(0, str(SCRIPTS))
    try:
        import verdict_simulation
    finally:
        sys.path.remove(str(SCRIPTS))
    return verdict_simulation


def test_aa_studies_order_nothing_on_the_cheap_paths():
    """scripts/verdict_simulation.py (docs/verdict.md's 2,000-study tables) at a size a test can run, through the
    project's verdict, stop rule and replicates=auto: identical configurations with the default target, with an
    explicit target half the jobs reach and stop.at_target + stop.behind, replicates=auto at every look, and K = 2
    under the rough noise model (heavy tails, round drift, learning noise per job: issue 59). An ordering claim (a fastest, a slower, a tie short of all) in at most 5 % of studies on each path."""
    simulation = _verdict_simulation()
    for cell in [(8, 0.1, 3, "default", False, "base"), (4, 0.1, 5, "explicit", True, "base"),
                 (3, 0.1, None, "explicit", False, "base"), (2, 0.1, 3, "default", False, "rough")]:
        *head, model = cell
        row = simulation.aa_cell((*head, 200, 48, model))
        print(row)
        assert row["claims"] <= 0.05, row


def test_a_true_2x_is_named_at_five_replicates_and_nothing_wrong_ever():
    simulation = _verdict_simulation()
    row = simulation.power_cell((2.0, 0.1, 5, False, 1.0, 200, 48, "base"))
    print(row)
    assert row["B named"] >= 0.9 and row["wrong named"] == 0.0, row
