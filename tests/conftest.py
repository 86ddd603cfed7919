"""Shared fixtures: a small demo dataset made once per session, a throwaway MLflow store, config composition."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, open_dict

from sweeplab import CONF_DIR

os.environ.setdefault("HYDRA_FULL_ERROR", "1")


CHECKOUT = Path(__file__).resolve().parents[1]
EXAMPLE = CHECKOUT / "examples" / "mlp_regressor"
WRITTEN_BY_SWEEPLAB = ("outputs", "multirun", "mlruns", "mlartifacts", "mlflow.db", "reports", "exports", "lightning_logs")


def _sweeplab_outputs_in_checkout() -> set[str]:
    found = set()
    for name in WRITTEN_BY_SWEEPLAB:
        path = CHECKOUT / name
        if path.is_dir():
            found |= {str(p.relative_to(CHECKOUT)) for p in path.iterdir() if p.name != ".gitkeep"}
        elif path.exists():
            found.add(name)
    return found


@pytest.fixture(scope="session", autouse=True)
def _tests_never_write_into_the_checkout():
    """Every test writes under its tmp_path; whatever appears in the checkout's output dirs is a test's bug."""
    before = _sweeplab_outputs_in_checkout()
    yield
    new = sorted(_sweeplab_outputs_in_checkout() - before)
    assert not new, f"tests wrote into the checkout: {new[:10]}"


@pytest.fixture(scope="session")
def demo_dir(tmp_path_factory) -> Path:
    """The demo dataset, small: 300 sentences, 500-token vocabulary, a 1-layer 64-d random teacher."""
    from sweeplab.families.textbridge.prepare import prepare_textbridge_demo

    out = tmp_path_factory.mktemp("data") / "textbridge_demo"
    return prepare_textbridge_demo(
        out, n_sentences=300, vocab_size=500, max_len=64, teacher="random", teacher_layers=1, teacher_dim=64,
        progress=False,
    )


@pytest.fixture(scope="session")
def minilm_demo_dir(tmp_path_factory) -> Path:
    """The default demo data as `make data` builds it (the all-MiniLM-L6-v2 teacher: 384-d targets, its 30522-token
    vocabulary), cut to its first 320 sentences so it builds in seconds; made once per session with the CLI."""
    from importlib import metadata

    from sweeplab.families.textbridge import minilm

    try:
        metadata.distribution(minilm.MINILM_WHEEL)
    except metadata.PackageNotFoundError:
        pytest.skip(f"{minilm.MINILM_WHEEL} is not installed (make install installs it)")
    out = tmp_path_factory.mktemp("data") / "textbridge_demo_minilm"
    subprocess.run(
        [sys.executable, "-m", "sweeplab.families.textbridge.prepare", "--teacher", "minilm", "--out", str(out),
         "--n-sentences", "320", "--no-progress"],
        check=True, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    return out


@pytest.fixture(scope="session")
def _empty_mlflow_db(tmp_path_factory) -> Path:
    """An initialised, empty MLflow sqlite store; creating the schema takes seconds, copying it does not."""
    from mlflow.tracking import MlflowClient

    path = tmp_path_factory.mktemp("mlflow") / "mlflow.db"
    MlflowClient(f"sqlite:///{path}").search_experiments()
    return path


@pytest.fixture
def no_network(monkeypatch):
    """Any attempt to reach a hub fails loudly instead of quietly downloading (the teacher tests use it)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def refuse(*args, **kwargs):
        raise OSError("network access attempted in an offline test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


@pytest.fixture
def mlflow_uri(tmp_path, monkeypatch, _empty_mlflow_db) -> str:
    shutil.copy(_empty_mlflow_db, tmp_path / "mlflow.db")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(tmp_path)  # artifacts, outputs/ and multirun/ land in the test's own directory
    return uri


def compose_train(overrides: list[str] = (), return_hydra_config: bool = False) -> DictConfig:
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose("train", overrides=list(overrides), return_hydra_config=return_hydra_config)


def smoke_config(demo_dir: Path, *overrides: str) -> DictConfig:
    """debug=smoke on the small demo data, 64-d targets; extra overrides win."""
    cfg = compose_train(["debug=smoke", f"data.path={demo_dir}", "model.out_dim=64", "data.batch_size=16", *overrides])
    with open_dict(cfg):
        cfg.trainer.enable_progress_bar = False
    return cfg


@pytest.fixture
def graph_path_on_cpu(monkeypatch):
    """Let `cuda_graph=true` plan on the CPU: the graph's steps then run eagerly (capture needs CUDA), so the code
    around them (step counting, logging, the guard, resume) is tested here."""
    from sweeplab.runtime import backends

    original = backends.check_combination

    def allow_cpu(*args, **kwargs):
        kwargs["cuda_graph"] = False
        return original(*args, **kwargs)

    monkeypatch.setattr(backends, "check_combination", allow_cpu)


@pytest.fixture(scope="session")
def example_install(tmp_path_factory) -> tuple[Path, str]:
    """examples/mlp_regressor installed (non-editable, no dependencies) into a directory of its own: (the directory,
    what pip printed, build output included)."""
    source = tmp_path_factory.mktemp("example") / EXAMPLE.name  # setuptools builds in the source tree: not ours
    shutil.copytree(EXAMPLE, source, ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
    site = tmp_path_factory.mktemp("site")
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--target", str(site), str(source)],
        check=True, capture_output=True, text=True,
    )
    return site, result.stdout + result.stderr


@pytest.fixture(scope="session")
def example_site(example_install) -> Path:
    """The directory the example family is installed in (put it on PYTHONPATH to use it)."""
    return example_install[0]
