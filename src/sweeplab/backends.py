"""Backends (cpu, mps, cuda, auto) and the precision/compile combinations each one can run.

Combinations that cannot work fail here, before any data is prepared; combinations known to be fragile warn.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass

import torch

from sweeplab.errors import ConfigError, UserError

log = logging.getLogger(__name__)

BACKENDS = ("cpu", "mps", "cuda", "auto")
PRECISIONS = ("32-true", "bf16-mixed", "16-mixed", "bf16-true")
COMPILE_MODES = ("off", "default", "reduce-overhead", "max-autotune")


@dataclass
class BackendConfig:
    name: str = "cpu"  # cpu | mps | cuda | auto (cuda, else mps, else cpu)
    matmul_precision: str = "high"  # torch.set_float32_matmul_precision: highest | high | medium
    mps_fallback: bool = False  # run ops MPS lacks on the CPU (PYTORCH_ENABLE_MPS_FALLBACK); slow, so opt-in
    cpu_threads: int | None = None  # torch.set_num_threads; null keeps torch's default

    def __post_init__(self) -> None:
        if self.name not in BACKENDS:
            raise ValueError(f"name={self.name!r} is not one of {BACKENDS}")
        if self.matmul_precision not in ("highest", "high", "medium"):
            raise ValueError(f"matmul_precision={self.matmul_precision!r} is not one of highest, high, medium")


def mps_available() -> bool:
    return bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available())


def resolve_backend(name: str) -> str:
    """The concrete backend this machine runs `name` on; a clear error when it is not there."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "mps" if mps_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise UserError("backend=cuda: no CUDA device is visible on this machine; use backend=cpu or backend=auto")
    if name == "mps" and not mps_available():
        where = "this is not an Apple-silicon Mac" if sys.platform != "darwin" else "this torch build has no MPS"
        raise UserError(f"backend=mps: MPS is not available ({where}); use backend=cpu or backend=auto")
    return name


def check_combination(backend: str, precision: str, compile_mode: str) -> None:
    """Refuse combinations that cannot work; warn about fragile ones. `backend` is already resolved."""
    if precision not in PRECISIONS:
        raise ConfigError("trainer.precision", f"{precision!r} is not one of {PRECISIONS}")
    if compile_mode not in COMPILE_MODES:
        raise ConfigError("compile", f"{compile_mode!r} is not one of {COMPILE_MODES}")
    if backend == "cpu" and precision == "16-mixed":
        raise ConfigError("trainer.precision", "16-mixed needs a GPU (CPU autocast supports bf16 only); use bf16-mixed or 32-true")
    if backend == "cuda" and "bf16" in precision and not torch.cuda.is_bf16_supported():
        raise ConfigError("trainer.precision", f"{precision} is not supported by {torch.cuda.get_device_name()}; use 16-mixed")
    if backend == "mps" and compile_mode != "off":
        log.warning("compile=%s on MPS: torch.compile's MPS backend is experimental; expect failures or slowdowns", compile_mode)
    if compile_mode == "reduce-overhead" and backend != "cuda":
        raise ConfigError("compile", "reduce-overhead uses CUDA graphs and needs backend=cuda; use compile=default")


def apply_backend_settings(cfg: BackendConfig, backend: str) -> None:
    torch.set_float32_matmul_precision(cfg.matmul_precision)
    if cfg.cpu_threads:
        torch.set_num_threads(cfg.cpu_threads)
    if backend == "mps" and cfg.mps_fallback:
        os.environ["PYTORCH_ENABLE_MPS_FALLBACK"] = "1"


def device_name(backend: str) -> str:
    if backend == "cuda":
        return torch.cuda.get_device_name()
    if backend == "mps":
        return "Apple MPS"
    import platform

    try:  # Linux: the CPU's marketing name says more than "x86_64"
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"
