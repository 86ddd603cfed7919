"""The code's shape, checked: the import layers written in pyproject.toml hold (no circle, no import up the layering),
no six lines are written twice in src/ outside the MLX ports of the models, and no function is over 80 lines."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src"
BIN = Path(sys.executable).parent
MAX_FUNCTION_LINES = 80


def _lint_imports(src: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(src)}
    return subprocess.run([str(BIN / "lint-imports"), "--config", str(REPO / "pyproject.toml"), "--no-cache"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def test_the_import_layers_hold():
    result = _lint_imports(SRC)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout


# Bad imports injected into a copy of src/, each of which the contracts must catch: (file, line added, the chain
# lint-imports names, the contract it breaks). An upward import between packages, one inside a package, circles
# between two modules of one package (the report's page importing the report's tables) and across packages; then
# those that went through before the contracts below the packages' own layers: the pure statistics importing MLflow,
# torch or the engine, the report importing the engine, a family importing another, the engine naming a family, a
# circle in export/, plain MLX importing Lightning, MLflow imported outside tracking/ (the run records, the report).
LAYERS = "sweeplab's layers"
PURE = "the statistics are pure: no engine, MLflow, Lightning or torch"
NO_ENGINE = "the study and the report never import the engine"
FAMILIES = "families: the record and its checks below, each family on its own"
LAUNCH_SIDE = "the launch side never imports the engine or a training framework"
SHELLS = "the hydra_plugins shells reach sweeplab through sweeplab.sweep only"
NEVER_TRAIN = "the processes that never train import no torch or Lightning"
POLICIES = "policies: both fit loops ask them, so no Lightning, torch or MLX"
BAD_IMPORTS = [
    ("engine/job.py", "from sweeplab.engine import training", "sweeplab.engine.job -> sweeplab.engine.training",
     "engine: one job"),
    ("report/html.py", "from sweeplab.report import tables", "sweeplab.report.html -> sweeplab.report.tables",
     "report: tables, figures, pages, MLflow views"),
    ("core/errors.py", "from sweeplab.engine import job", "sweeplab.core.errors -> sweeplab.engine.job", LAYERS),
    ("study/verdict/summary.py", "from sweeplab.report import tables",
     "sweeplab.study.verdict.summary -> sweeplab.report.tables", LAYERS),
    ("core/records.py", "from sweeplab.study import record", "sweeplab.core.records -> sweeplab.study.record", LAYERS),
    ("runtime/backends.py", "from sweeplab.runtime import devices",
     "sweeplab.runtime.backends -> sweeplab.runtime.devices", "runtime: the machine a job runs on"),
    ("study/replicates.py", "from sweeplab.study import verdict", "sweeplab.study.replicates -> sweeplab.study.verdict",
     "study: the record of a sweep and its verdict"),
    ("study/verdict/records.py", "import mlflow", "sweeplab.study.verdict.records -> mlflow", PURE),
    ("study/verdict/text.py", "from sweeplab.study.verdict import summary",
     "sweeplab.study.verdict.text -> sweeplab.study.verdict.summary", "study/verdict: the statistics by concern"),
    ("study/selection.py", "import torch", "sweeplab.study.selection -> torch", PURE),
    ("study/replicates.py", "from sweeplab.engine import plan", "sweeplab.study.replicates -> sweeplab.engine.plan",
     PURE),
    ("report/tables.py", "from sweeplab.engine import job", "sweeplab.report.tables -> sweeplab.engine.job", NO_ENGINE),
    ("families/pagating_lm/task.py", "from sweeplab.families.textbridge import task",
     "sweeplab.families.pagating_lm.task -> sweeplab.families.textbridge.task", FAMILIES),
    ("families/textbridge/data.py", "from sweeplab.families.textbridge_decoder import task",
     "sweeplab.families.textbridge.data -> sweeplab.families.textbridge_decoder.task", FAMILIES),
    ("engine/job.py", "from sweeplab.families.textbridge import data",
     "sweeplab.engine.job -> sweeplab.families.textbridge.data", "no module outside families/ names a family"),
    ("export/verify.py", "from sweeplab.export import pipeline", "sweeplab.export.verify -> sweeplab.export.pipeline",
     "export: the pipeline over Core AI over the conversion and its checks"),
    ("mlx/step.py", "import lightning", "sweeplab.mlx.step -> lightning",
     "mlx is plain MLX: no Lightning, MLflow or Hydra inside"),
    ("core/records.py", "import mlflow", "sweeplab.core.records -> mlflow", "only tracking imports MLflow"),
    ("report/config_runs.py", "from mlflow.entities import Metric", "sweeplab.report.config_runs -> mlflow",
     "only tracking imports MLflow"),
    # the launch side (sweep/grid.py, search.py, lanes.py) and its hydra_plugins shells: no MLflow, engine or family
    *[(f"sweep/{name}.py", line, f"sweeplab.sweep.{name} -> {chain}", contract)
      for name in ("grid", "search", "lanes") for line, chain, contract in [
          ("import mlflow", "mlflow", "only tracking imports MLflow"),
          ("from sweeplab.engine import training", "sweeplab.engine.training", LAUNCH_SIDE),
          ("from sweeplab.families.pagating_lm import task", "sweeplab.families.pagating_lm.task",
           "no module outside families/ names a family")]],
    # the processes that never train (the report, the UI, the sweeper's main): no torch or Lightning of their own;
    # the stop rules and the checkpoint policy are plain: both fit loops ask them
    ("core/stability.py", "import torch", "sweeplab.core.stability -> torch", NEVER_TRAIN),
    ("study/sweep.py", "import torch", "sweeplab.study.sweep -> torch", NEVER_TRAIN),
    ("report/tables.py", "import lightning", "sweeplab.report.tables -> lightning", NEVER_TRAIN),
    ("ui.py", "import torch", "sweeplab.ui -> torch", NEVER_TRAIN),
    ("sweep/callback.py", "import lightning", "sweeplab.sweep.callback -> lightning", NEVER_TRAIN),
    ("../hydra_plugins/sweeplab_sweeper/grid.py", "import torch", "hydra_plugins.sweeplab_sweeper.grid -> torch",
     NEVER_TRAIN),
    ("policies/stopping.py", "import lightning", "sweeplab.policies.stopping -> lightning", POLICIES),
    ("policies/checkpoints.py", "import torch", "sweeplab.policies.checkpoints -> torch", POLICIES),
    ("../hydra_plugins/sweeplab_sweeper/grid.py", "import mlflow", "hydra_plugins.sweeplab_sweeper.grid -> mlflow",
     "only tracking imports MLflow"),
    ("../hydra_plugins/sweeplab_sweeper/search.py", "from sweeplab.tracking import runs",
     "hydra_plugins.sweeplab_sweeper.search -> sweeplab.tracking.runs", SHELLS),
    ("../hydra_plugins/sweeplab_sweeper/lanes.py", "from sweeplab.engine import job",
     "hydra_plugins.sweeplab_sweeper.lanes -> sweeplab.engine.job", LAUNCH_SIDE),
]


# The injections #58's done-when list names, (module, what it imports): each must be among BAD_IMPORTS.
NAMED_BY_ISSUE_58 = [
    *[(f"sweep/{name}.py", imported) for name in ("grid", "search", "lanes")
      for imported in ("mlflow", "sweeplab.engine.training", "sweeplab.families.pagating_lm.task")],
    ("core/stability.py", "torch"), ("study/sweep.py", "torch"), ("report/tables.py", "lightning"),
    ("policies/stopping.py", "lightning"),
]


def test_every_injection_the_issue_names_is_tried():
    tried = {(where, chain.split(" -> ")[-1]) for where, _, chain, _ in BAD_IMPORTS}
    assert [named for named in NAMED_BY_ISSUE_58 if named not in tried] == []


# What a process that never trains imports at its start: the report's read path, the UI, the sweepers and their
# hydra_plugins shells, the study, its checks and its callback (the sweeper's main up to its launch), the store.
NEVER_TRAINING_MODULES = [
    "sweeplab.report.__main__", "sweeplab.report.tables", "sweeplab.ui", "sweeplab.sweep.grid", "sweeplab.sweep.search",
    "sweeplab.sweep.study", "sweeplab.sweep.callback", "sweeplab.sweep.checks", "hydra_plugins.sweeplab_sweeper.grid",
    "hydra_plugins.sweeplab_sweeper.search", "sweeplab.study.sweep", "sweeplab.study.rounds", "sweeplab.tracking.runs",
]


def test_the_processes_that_never_train_start_without_torch_or_lightning():
    code = ("import importlib, sys\n"
            f"for name in {NEVER_TRAINING_MODULES!r}:\n"
            "    importlib.import_module(name)\n"
            "    loaded = [m for m in ('torch', 'lightning', 'mlx') if m in sys.modules]\n"
            "    assert not loaded, (name, loaded)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]


def _contracts() -> list[dict]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]


@pytest.mark.parametrize("where,line,chain,contract", BAD_IMPORTS, ids=[f"{b[0].lstrip('./')}:{b[2].split()[-1]}" for b in BAD_IMPORTS])
def test_an_injected_bad_import_is_caught(tmp_path, where, line, chain, contract):
    copy = tmp_path / "src"
    shutil.copytree(SRC, copy, ignore=shutil.ignore_patterns("*.egg-info", "__pycache__"))
    module = copy / "sweeplab" / where
    module.write_text(module.read_text() + f"\n{line}  # noqa: E402\n")
    result = _lint_imports(copy)
    assert result.returncode != 0
    assert chain in result.stdout, result.stdout[-3000:]
    assert f"{contract} BROKEN" in result.stdout, result.stdout[-3000:]


def test_the_contract_against_naming_a_family_lists_every_family():
    """A new family is forbidden to the engine and the layers above it as soon as it exists."""
    named = next(c for c in _contracts() if c["name"] == "no module outside families/ names a family")
    families = {f"sweeplab.families.{p.name}" for p in (SRC / "sweeplab" / "families").iterdir()
                if (p / "__init__.py").exists()}
    assert set(named["forbidden_modules"]) == families


def test_no_layer_lets_its_modules_import_each_other_both_ways():
    """`:` in a layer would let two modules import each other; the contracts use only `|` (independent siblings)."""
    layers = [layer for contract in _contracts() for layer in contract.get("layers", [])]
    assert layers and not [layer for layer in layers if ":" in layer]


def test_every_module_of_the_machinery_sits_in_a_layer():
    """A new module must be placed in its package's contract (an unlisted module is not checked at all)."""
    unplaced = []
    for contract in _contracts():
        for container in contract.get("containers", []):
            listed = {name.strip() for layer in contract["layers"] for name in layer.split("|")}
            folder = SRC / Path(*container.split("."))
            present = {p.stem if p.suffix == ".py" else p.name for p in folder.iterdir()
                       if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").exists()}
            unplaced += [f"{container}.{name}" for name in sorted(present - listed)]
    assert unplaced == []


def test_every_environment_variable_of_sweeplab_is_named_in_channels():
    """core/channels.py names each SWEEPLAB_* variable once, with its writer and its readers: no other module spells
    one (a variable read where channels.py does not list it is a channel nobody can find)."""
    spelt = []
    for path in sorted(SRC.rglob("*.py")):
        if path == SRC / "sweeplab" / "core" / "channels.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and re.fullmatch(r"SWEEPLAB_[A-Z_]+",
                                                                                                node.value):
                spelt.append(f"{path.relative_to(REPO)}:{node.lineno} {node.value}")
    assert spelt == []


def _duplicates(paths: list[Path]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pylint", "--disable=all", "--enable=duplicate-code", "--min-similarity-lines=6",
         "--ignore=mlx_model.py", "--score=n", *map(str, paths)],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )


@pytest.mark.slow  # ~30 s here: pylint's duplicate-code pass over src/, which `make lint` runs too
def test_no_code_is_written_twice_outside_the_mlx_ports():
    result = _duplicates([SRC / "sweeplab"])
    assert "R0801" not in result.stdout, result.stdout[-4000:]


def test_the_duplicate_check_finds_a_copy(tmp_path):
    body = "".join(f"    total = total * {i} + len(values) - {i}\n" for i in range(8))
    for name in ("one", "two"):
        (tmp_path / f"{name}.py").write_text(f"def {name}(values):\n    total = 0\n{body}    return total\n")
    assert "R0801" in _duplicates([tmp_path / "one.py", tmp_path / "two.py"]).stdout


def test_no_function_is_longer_than_80_lines():
    long = []
    for path in sorted((SRC / "sweeplab").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({lines} lines)")
    assert long == []
