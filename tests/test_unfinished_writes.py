"""A write killed mid-way leaves its temp file beside the target; a job's start removes it (engine/job.py)."""

import signal
import subprocess
import sys

from sweeplab.core.files import atomic_write, remove_unfinished_writes


def test_a_killed_write_leaves_a_temp_file_that_the_next_start_removes_and_the_whole_file_stays(tmp_path):
    target = tmp_path / "last.ckpt"
    with atomic_write(target) as f:
        f.write(b"whole")
    killed = subprocess.run(
        [sys.executable, "-c", (
            "import os, signal, sys\n"
            "from sweeplab.core.files import atomic_write\n"
            f"with atomic_write({str(target)!r}) as f:\n"
            "    f.write(b'half'); f.flush()\n"
            "    os.kill(os.getpid(), signal.SIGKILL)\n"
        )], capture_output=True, text=True, timeout=120,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    (leftover,) = tmp_path.glob(".last.ckpt.*.tmp")
    assert leftover.read_bytes() == b"half" and target.read_bytes() == b"whole"
    (tmp_path / ".hidden").write_bytes(b"")  # another kind of file: not a write's leftover, kept
    assert remove_unfinished_writes(tmp_path) == [leftover]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".hidden", "last.ckpt"]
    assert remove_unfinished_writes(tmp_path / "absent") == []
