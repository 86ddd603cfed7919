"""scripts/cluster/start.sh installs SLURM's packages through scripts/cluster/install.sh, which waits for another
apt-get or dpkg holding their locks (apt's DPkg::Lock::Timeout; `apt-get update` tried again) instead of failing.
The locks are held for real (fcntl, as apt and dpkg take them) while a small package is installed, then removed."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "hello"  # GNU hello: 50 kB, in every Debian mirror
HOLD_S = 15
LOCKS = ["/var/lib/apt/lists/lock", "/var/lib/dpkg/lock-frontend", "/var/lib/dpkg/lock"]
HOLDER = """
import fcntl, os, sys, time
held = []
for path in sys.argv[2:]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o640)
    fcntl.lockf(fd, fcntl.LOCK_EX)
    held.append(fd)
print("held", flush=True)
time.sleep(float(sys.argv[1]))
"""


def _installed(package: str) -> bool:
    status = subprocess.run(["dpkg-query", "-W", "-f=${Status}", package], capture_output=True, text=True).stdout
    return "ok installed" in status


def test_the_packages_wait_for_another_apt_holding_the_locks(cluster):
    if _installed(PACKAGE):
        pytest.skip(f"{PACKAGE} is installed already: the test installs and removes it")
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(HOLD_S), *LOCKS], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        started = time.monotonic()
        result = subprocess.run([ROOT / "scripts/cluster/install.sh", PACKAGE], capture_output=True, text=True,
                                timeout=900)
        took = time.monotonic() - started
        print(f"install.sh waited for the locks: done {took:.1f} s after starting, the locks held {HOLD_S} s")
        assert result.returncode == 0, result.stdout + result.stderr
        assert "waits for another apt/dpkg" in result.stdout and holder.poll() is not None
        assert _installed(PACKAGE)
    finally:
        holder.kill()
        subprocess.run(["apt-get", "-o", "DPkg::Lock::Timeout=300", "purge", "-y", "-q", PACKAGE],
                       capture_output=True)
