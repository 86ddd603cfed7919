"""The code's shape, checked: the import layers written in pyproject.toml hold (no circle, no import up the layering),
no six lines are written twice in src/ outside the MLX ports of the models, and no function is over 80 lines."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

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


def test_an_import_up_the_layering_is_caught(tmp_path):
    """The same check on a copy of src/ where the job module imports the training module above it."""
    copy = tmp_path / "src"
    shutil.copytree(SRC, copy, ignore=shutil.ignore_patterns("*.egg-info", "__pycache__"))
    job = copy / "sweeplab" / "job.py"
    job.write_text(job.read_text() + "\nfrom sweeplab import training  # noqa: E402\n")
    result = _lint_imports(copy)
    assert result.returncode != 0
    assert "sweeplab.job -> sweeplab.training" in result.stdout


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
