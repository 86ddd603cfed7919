"""sweeplab as a user installs it: a wheel (not an editable install), its configs inside, used from outside the
checkout. The wheel is built from a copy of the sources, so the checkout gets no build/ or egg-info."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from sweeplab import CONF_DIR

CHECKOUT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    source = tmp_path_factory.mktemp("source")
    shutil.copytree(CHECKOUT / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    shutil.copytree(CHECKOUT / "conf", source / "conf")
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(CHECKOUT / name, source / name)
    dist = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(dist), str(source)],
                   check=True, capture_output=True, text=True)
    (built,) = dist.glob("sweeplab-*.whl")
    return built


def test_the_wheel_holds_every_config_and_the_search_path_plugin(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    configs = {f"sweeplab/conf/{p.relative_to(CONF_DIR).as_posix()}" for p in Path(CONF_DIR).rglob("*.yaml")}
    assert len(configs) > 30 and configs <= names, sorted(configs - names)[:5]
    assert "hydra_plugins/sweeplab_families/__init__.py" in names


@pytest.mark.slow  # ~11 s: a wheel installed and a job trained from outside the checkout
def test_a_non_editable_install_trains_from_outside_the_checkout(wheel, tmp_path, demo_dir):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    # the dependencies the test environment has installed, as a plain path: its .pth files (the editable
    # sweeplab among them) are not read, so `import sweeplab` can only find the wheel
    (site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", str(wheel)],
                   check=True, capture_output=True, text=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MLFLOW_TRACKING_URI")}
    work = tmp_path / "elsewhere"
    work.mkdir()

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([python, *args], cwd=work, env=env, capture_output=True, text=True, timeout=600)

    where = run("-c", "import sweeplab; print(sweeplab.CONF_DIR)")
    assert where.returncode == 0 and where.stdout.strip().startswith(str(site)), where.stdout + where.stderr
    helped = run("-m", "sweeplab.train", "--help")
    assert helped.returncode == 0, helped.stderr[-2000:]
    assert "model: pagating_lm, textbridge" in helped.stdout and "debug: smoke" in helped.stdout
    trained = run("-m", "sweeplab.train", "debug=smoke", f"data.path={demo_dir}", "model.out_dim=64",
                  "data.batch_size=16", "logger=none", "hydra.run.dir=out")
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert "done (not tracked): best val/cos" in trained.stdout + trained.stderr
    assert (work / "out" / "checkpoints").is_dir()
