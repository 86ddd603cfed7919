"""scripts/lanes_gpu.sh (issue 62's GPU measurements, run by the lead on a GPU host): its dry run prints, for each
part, the studies it measures side by side, and every printed command composes (a typo in an override would only
show on the GPU machine otherwise)."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "lanes_gpu.sh"


def _dry_run(part: str, tmp_path: Path) -> list[list[str]]:
    done = subprocess.run(["bash", str(SCRIPT), part], capture_output=True, text=True, timeout=60, cwd=ROOT,
                          env={**os.environ, "DRY": "1", "WORK": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    commands = [shlex.split(line) for line in done.stdout.splitlines() if line.startswith("python -m sweeplab.train")]
    assert all(c[4].startswith(f"hydra.sweep.dir={tmp_path}/") for c in commands)
    return [c[5:] for c in commands]


def test_part_one_measures_the_long_study_packed_and_one_at_a_time_and_an_aa_study(tmp_path):
    packed, one_at_a_time, aa = _dry_run("1", tmp_path)
    assert packed == ["sweep=default", "backend=cuda", "replicates=5", "trainer.max_steps=1000",
                      "trainer.val_check_interval=100"]  # the default launcher of a CUDA study: lanes, auto
    assert one_at_a_time == [*packed, "hydra/launcher=basic"]
    swept = [o for o in aa if "," in o]
    assert swept == ["checkpoint.every_n_seconds=600,601"]  # two configurations that differ in nothing that runs
    assert "replicates=5" in aa and "backend=cuda" in aa


def test_part_two_measures_the_default_study_both_ways_and_the_pagating_study(tmp_path):
    packed, one_at_a_time, pagating = _dry_run("2", tmp_path)
    assert packed == ["sweep=default", "backend=cuda"] and one_at_a_time == [*packed, "hydra/launcher=basic"]
    assert "model=pagating_lm" in pagating and not any(o.startswith("hydra/launcher") for o in pagating)


@pytest.mark.parametrize("part", ["1", "2"])
def test_every_command_of_the_script_composes(part, tmp_path):
    from sweeplab.core import cli

    for overrides in _dry_run(part, tmp_path):
        first_values = [o.split(",")[0] if "," in o else o for o in overrides]
        cfg = cli.compose("train", first_values)
        assert cfg.backend.name == "cuda"


def test_an_unknown_part_is_one_line_and_exit_2(tmp_path):
    done = subprocess.run(["bash", str(SCRIPT), "3"], capture_output=True, text=True, timeout=60, cwd=ROOT,
                          env={**os.environ, "DRY": "1", "WORK": str(tmp_path)})
    assert done.returncode == 2 and done.stderr.strip().startswith("unknown part '3'")
