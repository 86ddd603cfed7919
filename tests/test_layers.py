"""The code's shape, checked: the import layers written in pyproject.toml hold (no circle, no import up the layering),
no six lines are written twice in src/ outside the MLX ports of the models, and no function is over 80 lines."""

from __future__ import annotations

import ast
import os
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
# lint-imports names). An upward import between packages, one inside a package, circles between two modules of one
# package (the report's page importing the report's tables) and across packages.
BAD_IMPORTS = [
    ("engine/job.py", "from sweeplab.engine import training", "sweeplab.engine.job -> sweeplab.engine.training"),
    ("report/html.py", "from sweeplab.report import tables", "sweeplab.report.html -> sweeplab.report.tables"),
    ("core/errors.py", "from sweeplab.engine import job", "sweeplab.core.errors -> sweeplab.engine.job"),
    ("study/verdict.py", "from sweeplab.report import tables", "sweeplab.study.verdict -> sweeplab.report.tables"),
    ("core/schema.py", "from sweeplab.study import record", "sweeplab.core.schema -> sweeplab.study.record"),
    ("runtime/backends.py", "from sweeplab.runtime import devices", "sweeplab.runtime.backends -> sweeplab.runtime.devices"),
    ("study/replicates.py", "from sweeplab.study import verdict", "sweeplab.study.replicates -> sweeplab.study.verdict"),
]


@pytest.mark.parametrize("where,line,chain", BAD_IMPORTS, ids=[b[0] for b in BAD_IMPORTS])
def test_an_injected_bad_import_is_caught(tmp_path, where, line, chain):
    copy = tmp_path / "src"
    shutil.copytree(SRC, copy, ignore=shutil.ignore_patterns("*.egg-info", "__pycache__"))
    module = copy / "sweeplab" / where
    module.write_text(module.read_text() + f"\n{line}  # noqa: E402\n")
    result = _lint_imports(copy)
    assert result.returncode != 0
    assert chain in result.stdout, result.stdout[-3000:]


def test_no_layer_lets_its_modules_import_each_other_both_ways():
    """`:` in a layer would let two modules import each other; the contracts use only `|` (independent siblings)."""
    layers = [layer for contract in tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
              for layer in contract.get("layers", [])]
    assert layers and not [layer for layer in layers if ":" in layer]


def test_every_module_of_the_machinery_sits_in_a_layer():
    """A new module must be placed in its package's contract (an unlisted module is not checked at all)."""
    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    unplaced = []
    for contract in contracts:
        for container in contract.get("containers", []):
            listed = {name.strip() for layer in contract["layers"] for name in layer.split("|")}
            folder = SRC / Path(*container.split("."))
            present = {p.stem if p.suffix == ".py" else p.name for p in folder.iterdir()
                       if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").exists()}
            unplaced += [f"{container}.{name}" for name in sorted(present - listed)]
    assert unplaced == []


def _duplicates(paths: list[Path]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pylint", "--disable=all", "--enable=duplicate-code", "--min-similarity-lines=6",
         "--ignore=mlx_model.py", "--score=n", *map(str, paths)],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )


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
