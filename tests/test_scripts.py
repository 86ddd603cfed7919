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


def test_aa_verdict_names_no_configuration_fastest_under_the_family_defaults():
    """scripts/aa_verdict.py (issue 38's A/A figures, 2,000 sweeps in docs/verdict.md) at a size a test can run:
    a few percent at most, where the old default of 0 named one in a quarter of the sweeps."""
    result = subprocess.run([sys.executable, str(SCRIPTS / "aa_verdict.py"), "--sweeps", "200", "--replicates", "3"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    rates = [float(line.split("fastest in ")[1].split("%")[0]) for line in result.stdout.splitlines()
             if "fastest in " in line]
    assert len(rates) >= 3 and max(rates) <= 5.0, result.stdout
