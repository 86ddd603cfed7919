"""Whether a backend can be on this machine at all, answered without importing torch or MLX (a second, not the
10-15 CPU-seconds torch's import costs on a small machine): the training app refuses `backend=cuda` where no GPU
device exists, `backend=mps` off macOS and `backend=mlx` without the mlx package before it imports the engine.

Only the certain cases are answered here; where a device might be there (an NVIDIA device node, macOS), torch
decides (runtime/backends.resolve_backend, with the same lines). Checked in the job's own process: a sweep's jobs may
run on other hosts (SLURM) than the one that submits them.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import sys

from sweeplab.core.errors import UserError

MLX_INSTALL = "pip install 'sweeplab[mlx]'"
NO_CUDA = "backend=cuda: no CUDA device is visible on this machine{why}; use backend=cpu or backend=auto"
NO_MPS = "backend=mps: MPS is not available ({why}); use backend=cpu or backend=auto"
NO_MLX = f"backend=mlx: the mlx package is not installed; {MLX_INSTALL}"
# the device files a CUDA (or ROCm, which torch.cuda also drives) GPU shows on Linux: NVIDIA's, WSL2's GPU bridge,
# AMD's compute interface
GPU_DEVICE_FILES = ("/dev/nvidia[0-9]*", "/dev/dxg", "/dev/kfd")


def no_cuda_here() -> str | None:
    """Why this machine certainly has no CUDA device (words for NO_CUDA), or None where torch must decide."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return f" (CUDA_VISIBLE_DEVICES={visible!r} hides every device)"
    if sys.platform == "darwin":
        return " (macOS has no CUDA)"
    if sys.platform.startswith("linux") and not any(glob.glob(pattern) for pattern in GPU_DEVICE_FILES):
        return " (no GPU device file: /dev/nvidia*, /dev/dxg, /dev/kfd)"
    return None


def no_mps_here() -> str | None:
    """Why this machine certainly has no MPS (words for NO_MPS), or None on macOS, where torch must decide."""
    return None if sys.platform == "darwin" else f"this is {sys.platform}, not an Apple-silicon Mac"


def refuse_absent_backend(name: str) -> None:
    """A UserError (one line) when backend `name` certainly cannot run on this machine; nothing imported."""
    if name == "cuda" and (why := no_cuda_here()) is not None:
        raise UserError(NO_CUDA.format(why=why))
    if name == "mps" and (why := no_mps_here()) is not None:
        raise UserError(NO_MPS.format(why=why))
    if name == "mlx" and importlib.util.find_spec("mlx") is None:
        raise UserError(NO_MLX)
