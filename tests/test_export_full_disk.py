"""`python -m sweeplab.export` onto a full disk: coremltools' save copies its package with shutil.copytree, which
reports ENOSPC as a `shutil.Error` listing each file; the export turns it into one `error:` line (exit status 2) and
leaves no package, no staging copy and no empty folder it made. The disk is a real tiny tmpfs in a private mount
namespace; what is left on it is listed before the namespace goes."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

import pytest

from test_bad_environment import needs_mounts, tmpfs
from test_bad_input import error_lines
from test_export import checkpoints  # noqa: F401  (the module's tiny trained checkpoints, a fixture)


@needs_mounts
@pytest.mark.slow  # a fresh interpreter loads torch, Lightning and coremltools and converts: ~30 s on 2 busy cores
def test_a_full_disk_inside_coremltools_save_is_one_line_and_leaves_nothing(checkpoints, tmp_path):  # noqa: F811
    disk, listing = tmp_path / "disk", tmp_path / "left-on-disk.txt"
    out = disk / "exports" / "textbridge"  # two folders the export has to make
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    export = shlex.join([sys.executable, "-m", "sweeplab.export", f"ckpt_path={checkpoints['textbridge']}", f"out={out}",
                         "export.n_random=1", "export.readiness=false"])
    # 8 KiB: the folders and the package's small files fit, its weights do not
    script = f"{tmpfs(disk, size='8k')} && {{ {export}; status=$?; find {disk} -mindepth 1 > {listing}; exit $status; }}"
    done = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)

    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "shutil.Error" not in done.stderr, done.stderr[-3000:]
    (line,) = error_lines(done.stderr)
    assert line == f"error: cannot save {out / 'textbridge-standard-fp16.mlpackage'}: No space left on device", line
    assert listing.read_text() == "", listing.read_text()  # no package, no .tmp staging folder, no empty exports/
