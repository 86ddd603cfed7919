"""A Python that compiles the heavy libraries' sources at every start is found, in a real interpreter with the real
environment variable, and a compiled one is not (sweeplab.core.bytecode)."""

from __future__ import annotations

import compileall
import json
import os
import subprocess
import sys

import pytest

CHECK = (
    "import json, sys; from sweeplab.core import bytecode; "
    "found = bytecode.uncached_packages(tuple(sys.argv[1:])); "
    "print(json.dumps([found, bytecode.uncached_warning(found)]))"
)


def _check(tmp_path, *packages, env=None):
    environ = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")}
    environ["PYTHONPATH"] = os.pathsep.join([str(tmp_path / "site"), *sys.path])
    environ.update(env or {})
    out = subprocess.run([sys.executable, "-c", CHECK, *packages], env=environ, capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout)


@pytest.fixture
def site(tmp_path):
    package = tmp_path / "site" / "heavypkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("VALUE = 1\n")
    return package


def test_sources_without_bytecode_under_pythondontwritebytecode_are_found(tmp_path, site):
    found, message = _check(tmp_path, "heavypkg", "no_such_package_here", env={"PYTHONDONTWRITEBYTECODE": "1"})
    assert found == ["heavypkg"]
    assert "PYTHONDONTWRITEBYTECODE" in message and "compileall" in message and str(site.parent) in message


def test_compiled_once_they_are_not(tmp_path, site):
    assert compileall.compile_dir(str(site), quiet=1)
    assert _check(tmp_path, "heavypkg", env={"PYTHONDONTWRITEBYTECODE": "1"}) == [[], None]


def test_a_python_that_may_write_them_pays_only_once(tmp_path, site):
    assert _check(tmp_path, "heavypkg") == [[], None]


def test_the_installed_torch_is_judged_where_its_cache_would_be(tmp_path):
    """PYTHONPYCACHEPREFIX moves every cached file: an empty prefix folder plus PYTHONDONTWRITEBYTECODE is exactly a
    container image's state for the real torch (found, not imported)."""
    prefix = tmp_path / "pycache"
    prefix.mkdir()
    found, _ = _check(tmp_path, "torch", env={"PYTHONDONTWRITEBYTECODE": "1", "PYTHONPYCACHEPREFIX": str(prefix)})
    assert found == ["torch"]
    assert _check(tmp_path, "torch") == [[], None]  # this checkout's virtualenv: pip compiled it


def test_the_warning_is_logged_once_per_process(tmp_path):
    prefix = tmp_path / "pycache"
    prefix.mkdir()
    code = ("import logging; from sweeplab.core import bytecode; log = logging.getLogger('sweeplab'); "
            "bytecode.warn_once(log); bytecode.warn_once(log)")
    environ = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", PYTHONPYCACHEPREFIX=str(prefix),
                   PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run([sys.executable, "-c", code], env=environ, capture_output=True, text=True, check=True)
    assert out.stderr.count("Python compiles torch, lightning, sympy's sources at every start here") == 1, out.stderr


@pytest.mark.slow  # ~25 s: the sweep's imports compiled from source on 2 cores
def test_a_sweep_whose_python_compiles_its_libraries_says_so_in_its_log_its_run_and_its_report(
        demo_dir, mlflow_uri, tmp_path):
    """A container's state for real: PYTHONDONTWRITEBYTECODE and an empty cache folder (PYTHONPYCACHEPREFIX), two
    jobs in one process. The warning comes once, the parent run names the packages, report.md says what it cost."""
    from tests.test_sweeps_parallel import smoke, store_runs, sweep

    prefix = tmp_path / "pycache"
    prefix.mkdir()
    result = sweep(tmp_path, "-m", *smoke(demo_dir, "data.batch_size=8,16"), f"hydra.sweep.dir={tmp_path / 'sweep'}",
                   env={"PYTHONDONTWRITEBYTECODE": "1", "PYTHONPYCACHEPREFIX": str(prefix)})
    assert result.returncode == 0, result.stderr[-3000:]
    log = result.stdout + result.stderr
    assert log.count("Python compiles torch, lightning, sympy's sources at every start here") == 1, log[-3000:]
    assert not any(prefix.iterdir())  # nothing was written: the state a next process finds is the same
    (parent,), children = store_runs(mlflow_uri)
    assert len(children) == 2
    assert parent.data.tags["sweep/uncached_bytecode"] == "torch, lightning, sympy"
    report = (tmp_path / "sweep" / "report.md").read_text()
    assert "this Python compiled torch, lightning, sympy's sources at its start" in report
