"""Remote tracking: with MLFLOW_TRACKING_URI pointing at an `mlflow server`, a sweep works unchanged (runs, params,
artifacts through the server's artifact proxy, the report on the parent)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from mlflow.tracking import MlflowClient

from test_sweeps_parallel import assert_one_sweep, smoke, sweep


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def mlflow_server(tmp_path):
    """`mlflow server` on 127.0.0.1 (free port), sqlite backend and artifact store in tmp; stopped afterwards."""
    port = _free_port()
    mlflow = Path(sys.executable).with_name("mlflow")
    log = open(tmp_path / "server.log", "w")
    server = subprocess.Popen(
        [str(mlflow), "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
         "--backend-store-uri", f"sqlite:///{tmp_path / 'server.db'}",
         "--serve-artifacts", "--artifacts-destination", str(tmp_path / "server_artifacts")],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,  # its own group: uvicorn's workers stop with it
    )
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if requests.get(f"{uri}/health", timeout=1).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"mlflow server did not start: {(tmp_path / 'server.log').read_text()[-2000:]}")
            time.sleep(0.5)
        yield uri
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
        log.close()


@pytest.mark.slow
def test_a_sweep_against_a_tracking_server(demo_dir, mlflow_server, tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    monkeypatch.chdir(tmp_path)
    result = sweep(tmp_path, "-m", *smoke(demo_dir, "data.batch_size=8,16", "trainer.max_steps=6", "trainer.val_check_interval=3"))
    assert result.returncode == 0, result.stderr[-3000:]
    parent, children = assert_one_sweep(mlflow_server, 2)
    client = MlflowClient(mlflow_server)
    for run in children:
        assert "config.yaml" in {a.path for a in client.list_artifacts(run.info.run_id)}
        assert {"val/cos", "objective"} <= set(run.data.metrics)
    reported = {a.path for a in client.list_artifacts(parent.info.run_id, "report")}
    assert {"report/report.md", "report/validation.png"} <= reported
    assert list((tmp_path / "server_artifacts").rglob("report.md"))  # stored by the server, not by the client
    assert not (tmp_path / "mlflow.db").exists()
