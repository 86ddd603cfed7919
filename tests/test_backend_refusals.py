"""A backend this machine certainly lacks (backend=cuda without a GPU device, backend=mps off macOS, backend=mlx
without the mlx package) is refused in one line before torch is imported (sweeplab.runtime.availability): the
process's own import log (`python -X importtime`) shows no torch, nor scipy.stats (a CPU-second of its own: the
verdict's arithmetic imports it when first used, sweeplab.study.selection)."""

from __future__ import annotations

import glob
import subprocess
import sys

import pytest

from sweeplab.runtime import availability

# the mlx package made unimportable in a real interpreter, as on a machine without it
NO_MLX = "import sys, runpy; sys.modules['mlx'] = None; sys.argv[0] = 'train'; runpy.run_module('sweeplab.train', run_name='__main__')"


def refused(tmp_path, backend: str, *, without_mlx: bool = False) -> tuple[list[str], list[str]]:
    """(the `error:` lines, the modules imported) of `python -m sweeplab.train backend=...`."""
    start = ["-c", NO_MLX] if without_mlx else ["-m", "sweeplab.train"]
    result = subprocess.run([sys.executable, "-X", "importtime", *start, f"backend={backend}", "debug=smoke",
                             "logger=none", f"hydra.run.dir={tmp_path}"],
                            capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.splitlines()
    modules = [line.rsplit("|", 1)[-1].strip() for line in lines if line.startswith("import time:")]
    return [line for line in lines if line.startswith("error:")], modules


@pytest.mark.skipif(sys.platform == "darwin", reason="MPS may be there: torch decides")
def test_backend_mps_off_macos_is_refused_before_torch(tmp_path):
    errors, modules = refused(tmp_path, "mps")
    assert errors == [f"error: backend=mps: MPS is not available (this is {sys.platform}, not an Apple-silicon "
                      "Mac); use backend=cpu or backend=auto"]
    assert "hydra" in modules and "torch" not in modules and "scipy.stats" not in modules


@pytest.mark.skipif(any(glob.glob(p) for p in availability.GPU_DEVICE_FILES), reason="a GPU device file: torch decides")
def test_backend_cuda_without_a_gpu_is_refused_before_torch(tmp_path):
    errors, modules = refused(tmp_path, "cuda")
    assert len(errors) == 1 and errors[0].startswith("error: backend=cuda: no CUDA device is visible"), errors
    assert "use backend=cpu or backend=auto" in errors[0]
    assert "hydra" in modules and "torch" not in modules and "scipy.stats" not in modules


def test_backend_mlx_without_the_package_is_refused_before_torch(tmp_path):
    errors, modules = refused(tmp_path, "mlx", without_mlx=True)
    assert errors == ["error: backend=mlx: the mlx package is not installed; pip install 'sweeplab[mlx]'"]
    assert "hydra" in modules and "torch" not in modules


def test_cuda_hidden_by_cuda_visible_devices_is_named(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(Exception, match="CUDA_VISIBLE_DEVICES='' hides every device"):
        availability.refuse_absent_backend("cuda")
    availability.refuse_absent_backend("cpu")  # nothing to refuse
