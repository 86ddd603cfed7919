"""`make ui` (python -m sweeplab.ui): the address is printed only once the server answers, and the server is sized
for the machine (issue 38)."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from sweeplab import ui


def test_the_server_has_one_worker_per_two_cores_between_one_and_four():
    assert [ui.server_workers(c) for c in (1, 2, 3, 4, 8, 64)] == [1, 1, 1, 2, 4, 4]


@pytest.mark.slow  # an mlflow server's start: 5 s idle, a minute or more on a loaded 2-core machine
def test_the_address_answers_the_moment_it_is_printed(mlflow_uri, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    process = subprocess.Popen([sys.executable, "-m", "sweeplab.ui", "--host", "127.0.0.1", "--port", str(port)],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path,
                               env={**os.environ, "MLFLOW_TRACKING_URI": mlflow_uri}, start_new_session=True)
    seen = []
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            line = process.stdout.readline()
            assert line, "".join(seen)
            seen.append(line)
            found = re.search(r"(http://127\.0\.0\.1:\d+)/#/", line)
            if found:  # fetched at once: no retry
                with urllib.request.urlopen(f"{found.group(1)}/health", timeout=5) as response:
                    assert response.status == 200
                break
        else:
            pytest.fail("no address printed: " + "".join(seen))
        assert seen[0].startswith(f"starting the MLflow UI on http://127.0.0.1:{port}"), seen
    finally:
        os.killpg(process.pid, signal.SIGTERM)  # sweeplab.ui stops the server's group on SIGTERM
        process.wait(timeout=60)
