"""Backends (cpu, mps, cuda, auto, and mlx: Apple's MLX, trained by sweeplab.engine.mlx_fit) and the precision/compile combinations each one can run.

Combinations that cannot work fail here, before any data is prepared; combinations known to be fragile warn.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Annotated

import torch
from annotated_types import Ge

from sweeplab.core import mps_fallback
from sweeplab.core.errors import ConfigError, UserError
from sweeplab.core.records import JOB, JobRun
from sweeplab.runtime.availability import NO_CUDA, NO_MLX, NO_MPS, no_mps_here

log = logging.getLogger(__name__)

BACKENDS = ("cpu", "mps", "cuda", "auto", "mlx")
MLX_DEVICES = ("auto", "gpu", "cpu")
PRECISIONS = ("32-true", "bf16-mixed", "16-mixed", "bf16-true")
COMPILE_MODES = ("off", "default", "reduce-overhead", "max-autotune")


@dataclass
class BackendConfig:
    name: str = "cpu"  # cpu | mps | cuda | auto (cuda, else mps, else cpu)
    matmul_precision: str = "high"  # torch.set_float32_matmul_precision: highest | high | medium
    mps_fallback: bool = False  # run ops MPS lacks on the CPU (PYTORCH_ENABLE_MPS_FALLBACK); slow, so opt-in
    cpu_threads: Annotated[int, Ge(1)] | None = None  # torch.set_num_threads; null keeps torch's default
    # cuDNN tries its convolution algorithms once per input shape and keeps the fastest. TextBridge's dilated
    # convolutions train 1.5x faster on an H100 with it (BENCHMARKS.md); it costs a few ms per new shape.
    cudnn_benchmark: bool = True  # CUDA only
    device: str = "auto"  # backend=mlx only: gpu (Metal), cpu, or auto (the GPU where MLX has one)

    def __post_init__(self) -> None:
        if self.name not in BACKENDS:
            raise ValueError(f"name={self.name!r} is not one of {BACKENDS}")
        if self.device not in MLX_DEVICES:
            raise ValueError(f"device={self.device!r} is not one of {MLX_DEVICES}")
        if self.matmul_precision not in ("highest", "high", "medium"):
            raise ValueError(f"matmul_precision={self.matmul_precision!r} is not one of highest, high, medium")


def mps_available() -> bool:
    return bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available())


def import_mlx():
    """mlx.core, or one line saying how to install it."""
    try:
        import mlx.core as mx
    except ImportError:
        raise UserError(NO_MLX) from None
    return mx


def mlx_device(device: str) -> str:
    """The device MLX runs `backend.device` on here (gpu or cpu); a clear error when there is no GPU for MLX."""
    mx = import_mlx()
    has_gpu = mx.is_available(mx.gpu)
    if device == "gpu" and not has_gpu:
        raise ConfigError("backend.device", "gpu: this MLX build has no GPU on this machine (the Linux CPU wheel?); use backend.device=cpu")
    return "gpu" if device == "gpu" or (device == "auto" and has_gpu) else "cpu"


def resolve_backend(name: str) -> str:
    """The concrete backend this machine runs `name` on; a clear error when it is not there."""
    if name == "mlx":
        import_mlx()
        return "mlx"
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "mps" if mps_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise UserError(NO_CUDA.format(why=""))
    if name == "mps" and not mps_available():
        raise UserError(NO_MPS.format(why=why_no_mps()))
    return name


def why_no_mps() -> str:
    """The usual reason this machine has no MPS, for the one-line error."""
    if (why := no_mps_here()) is not None:
        return why
    if not torch.backends.mps.is_built():
        return "this torch build has no MPS; install the macOS arm64 wheel"
    import platform

    # torch finds no MPS device where MPSGraph lacks a method of macOS 14.0 (aten/src/ATen/mps/MPSDevice.mm); an
    # x86_64 Python (an Intel Mac, or Rosetta on Apple silicon) has no Apple GPU to find (issue #30)
    machine, version = platform.machine(), platform.mac_ver()[0] or "unknown"
    return (
        f"platform.machine()={machine}, macOS {version}: MPS needs an arm64 Python on an Apple-silicon Mac with macOS "
        "14 or newer; the usual causes are an Intel Mac, an x86_64 Python under Rosetta, or an older macOS"
    )


OPTIMIZER_IMPLEMENTATIONS = ("auto", "fused", "foreach", "for_loop")
# torch's fused Adam/AdamW kernels, by device type, from this torch version on
FUSED_OPTIMIZER_SINCE = {"cuda": (2, 0), "cpu": (2, 4), "mps": (2, 5)}


def _torch_version() -> tuple[int, int]:
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return int(major), int(minor)


def check_combination(
    backend: str,
    precision: str,
    compile_mode: str,
    *,
    optim_implementation: str = "auto",
    pin_memory: bool = False,
    gradient_checkpointing: bool = False,
    grad_clip: float | None = None,
    cuda_graph: bool = False,
    steps_per_batch: int = 1,
    devices: int = 1,
    accumulate_grad_batches: int = 1,
) -> list[str]:
    """Refuse combinations that cannot work; warn about fragile ones. `backend` is already resolved.

    Covers the whole backend matrix: backend x precision x compile, and the optimisation switches (fused/foreach
    optimizer, pinned memory, gradient checkpointing). Returns the warnings it logged, so callers and tests can
    show them. Batch size needs no check here: every batch size runs everywhere memory allows.
    """
    warnings: list[str] = []

    def warn(message: str) -> None:
        log.warning("%s", message)
        warnings.append(message)

    if backend not in ("cpu", "mps", "cuda", "mlx"):
        raise ConfigError("backend.name", f"{backend!r} is not a resolved backend (cpu, mps, cuda or mlx)")
    if precision not in PRECISIONS:
        raise ConfigError("trainer.precision", f"{precision!r} is not one of {PRECISIONS}")
    if compile_mode not in COMPILE_MODES:
        raise ConfigError("compile", f"{compile_mode!r} is not one of {COMPILE_MODES}")
    if optim_implementation not in OPTIMIZER_IMPLEMENTATIONS:
        raise ConfigError("optim.implementation", f"{optim_implementation!r} is not one of {OPTIMIZER_IMPLEMENTATIONS}")
    if backend == "mlx":
        _check_mlx(precision, compile_mode, optim_implementation, gradient_checkpointing, cuda_graph, steps_per_batch,
                   devices, accumulate_grad_batches)
        return warnings
    if backend == "mps" and devices != 1:
        # a Mac has one GPU: Lightning refuses more only when the Trainer is built, after the job's MLflow run exists
        raise ConfigError(JOB.devices, f"{devices}: a Mac has one MPS device; use trainer.devices=1")

    _check_precision(backend, precision)
    _check_compile(backend, compile_mode, warn)
    _check_optimisation(backend, precision, optim_implementation, grad_clip, pin_memory, gradient_checkpointing,
                        compile_mode, warn)
    _check_step_capture(backend, precision, compile_mode, cuda_graph, steps_per_batch, devices, accumulate_grad_batches,
                        gradient_checkpointing, warn)
    return warnings


def _check_precision(backend: str, precision: str) -> None:
    if backend == "cpu" and precision == "16-mixed":
        raise ConfigError("trainer.precision", "16-mixed needs a GPU (CPU autocast supports bf16 only); use bf16-mixed or 32-true")
    if backend == "cuda" and "bf16" in precision and not torch.cuda.is_bf16_supported():
        raise ConfigError("trainer.precision", f"{precision} is not supported by {torch.cuda.get_device_name()}; use 16-mixed")
    if backend == "mps" and "bf16" in precision and not _mps_macos_at_least(14):
        raise ConfigError("trainer.precision", f"{precision} on MPS needs macOS 14 or newer; use 16-mixed or 32-true")


def _check_compile(backend: str, compile_mode: str, warn) -> None:
    if compile_mode == "reduce-overhead" and backend != "cuda":
        raise ConfigError("compile", "reduce-overhead uses CUDA graphs and needs backend=cuda; use compile=default")
    if backend == "mps" and compile_mode != "off":
        warn(f"compile={compile_mode} on MPS: torch.compile's MPS backend is experimental; expect failures or slowdowns")
    if backend == "cpu" and compile_mode != "off" and not _has_cxx_compiler():
        raise ConfigError("compile", f"compile={compile_mode} on the CPU needs a C++ compiler (g++ or clang++) on PATH; use compile=off")
    if backend == "cpu" and compile_mode == "max-autotune":
        warn("compile=max-autotune on the CPU: long compilation for little gain over compile=default")


def _check_optimisation(backend: str, precision: str, optim_implementation: str, grad_clip: float | None,
                        pin_memory: bool, gradient_checkpointing: bool, compile_mode: str, warn) -> None:
    if optim_implementation == "fused":
        since = FUSED_OPTIMIZER_SINCE[backend]
        if _torch_version() < since:
            raise ConfigError(
                "optim.implementation",
                f"fused Adam/AdamW on {backend} needs torch >= {since[0]}.{since[1]} (this is {torch.__version__}); "
                "use foreach or auto",
            )
        if grad_clip and precision == "16-mixed":
            raise ConfigError(
                "optim.implementation",
                "a fused optimizer unscales fp16 gradients inside its step, so they cannot be clipped before it "
                "(Lightning refuses); use optim.implementation=foreach, trainer.precision=bf16-mixed or optim.grad_clip=null",
            )
    if optim_implementation == "foreach" and backend == "cpu":
        warn("optim.implementation=foreach on the CPU: torch has no multi-tensor CPU kernels, it loops like for_loop")
    if optim_implementation == "foreach" and backend == "mps" and "mps" not in _foreach_kernel_devices():
        warn(
            "optim.implementation=foreach on MPS: this torch has no multi-tensor MPS kernels, its _foreach ops loop "
            "over the tensors; use optim.implementation=fused (MPS fused Adam/AdamW) or auto"
        )
    if pin_memory and backend == "cpu":
        warn("data.pin_memory=true with backend=cpu: there is no host-to-device copy to speed up; it only costs memory")
    if pin_memory and backend == "mps":
        warn(
            "data.pin_memory=true with backend=mps: Lightning copies to MPS blocking (pytorch#83015), so pinned "
            "memory gives no overlap"
        )
    if gradient_checkpointing and compile_mode == "reduce-overhead":
        warn("model.gradient_checkpointing with compile=reduce-overhead: recomputation inside CUDA graphs is fragile")


def _check_step_capture(backend: str, precision: str, compile_mode: str, cuda_graph: bool, steps_per_batch: int,
                        devices: int, accumulate_grad_batches: int, gradient_checkpointing: bool, warn) -> None:
    """The whole step as one CUDA graph (tasks/step_graph.py), and several optimizer steps per batch."""
    if cuda_graph:
        if backend != "cuda":
            raise ConfigError("cuda_graph", f"CUDA graphs need backend=cuda (this job runs on {backend}); use cuda_graph=false")
        if compile_mode in ("reduce-overhead", "max-autotune"):
            raise ConfigError(
                "cuda_graph",
                f"compile={compile_mode} makes its own CUDA graphs, which cannot nest in the step's; use compile=default",
            )
        if gradient_checkpointing:
            warn("model.gradient_checkpointing with cuda_graph=true: recomputation inside a CUDA graph is fragile")
    # a captured step and a batch of several optimizer steps (tasks/step_graph.py) both run backward and the update
    # themselves, outside Lightning's precision plugin, DDP reducer and gradient accumulation
    if cuda_graph or steps_per_batch > 1:
        key, what = ("cuda_graph", "the captured step") if cuda_graph else (
            "steps_per_batch", f"a batch of {steps_per_batch} optimizer steps")
        if precision == "16-mixed":
            raise ConfigError(key, f"16-mixed scales the loss on the host at each step, which {what} bypasses; use bf16-mixed or 32-true")
        if devices != 1:
            raise ConfigError(key, f"{what} has no DDP gradient all-reduce; use trainer.devices=1")
        if accumulate_grad_batches != 1:
            raise ConfigError(key, f"{what} takes one batch per optimizer step; use trainer.accumulate_grad_batches=1")


def _check_mlx(
    precision: str, compile_mode: str, optim_implementation: str, gradient_checkpointing: bool, cuda_graph: bool,
    steps_per_batch: int, devices: int, accumulate_grad_batches: int,
) -> None:
    """What sweeplab's MLX loop (sweeplab.engine.mlx_fit) does not do: PyTorch's own switches, and what it has no port of.
    Its training step is always compiled with mx.compile."""
    if compile_mode != "off":
        raise ConfigError("compile", f"{compile_mode} is torch.compile; backend=mlx compiles its step with mx.compile itself: use compile=off")
    if cuda_graph:
        raise ConfigError("cuda_graph", "CUDA graphs are PyTorch's; backend=mlx compiles its step with mx.compile: use cuda_graph=false")
    if steps_per_batch != 1:
        raise ConfigError("steps_per_batch", f"{steps_per_batch}: backend=mlx runs one optimizer step per batch; use steps_per_batch=1")
    if precision not in ("32-true", "bf16-mixed"):
        raise ConfigError("trainer.precision", f"{precision}: backend=mlx trains in 32-true or bf16-mixed (no fp16 loss "
                          "scaler, no bfloat16 weights); use bf16-mixed")
    if optim_implementation not in ("auto", "for_loop"):
        raise ConfigError("optim.implementation", f"{optim_implementation} selects torch's optimizer kernels; backend=mlx has one: use auto")
    if devices != 1:
        raise ConfigError(JOB.devices, f"{devices}: backend=mlx trains on one device; use trainer.devices=1")
    if gradient_checkpointing:
        raise ConfigError("model.gradient_checkpointing", "the MLX models do not recompute blocks; use model.gradient_checkpointing=false")


def _foreach_kernel_devices() -> list[str]:
    """Device types with torch's multi-tensor (foreach) kernels, as torch's optimizers and clipping decide."""
    from torch.utils._foreach_utils import _get_foreach_kernels_supported_devices

    return _get_foreach_kernels_supported_devices()


def _mps_macos_at_least(major: int) -> bool:
    check = getattr(torch.backends.mps, "is_macos_or_newer", None)
    if check is None:
        return True  # older torch: let autocast say it
    try:
        return bool(check(major, 0))
    except Exception:
        return True


def _has_cxx_compiler() -> bool:
    import shutil

    return any(shutil.which(name) for name in (os.environ.get("CXX", ""), "g++", "c++", "clang++") if name)


def precision_plugins(precision: str, backend: str) -> list:
    """Precision plugins for the Trainer (then `precision=None`): empty unless the precision needs our own.

    Lightning's MixedPrecision refuses gradient clipping with fused optimizers for bf16 too, where no gradient
    scaler exists and nothing is unscaled inside the optimizer step; for bf16-mixed we clip as for 32-true.
    """
    if precision != "bf16-mixed":
        return []
    from lightning.pytorch.plugins.precision import MixedPrecision, Precision

    class BF16MixedPrecision(MixedPrecision):
        def clip_gradients(self, optimizer, clip_val=0.0, gradient_clip_algorithm=None):
            from lightning.pytorch.utilities import GradClipAlgorithmType

            algorithm = gradient_clip_algorithm or GradClipAlgorithmType.NORM
            Precision.clip_gradients(self, optimizer, clip_val, algorithm)

    return [BF16MixedPrecision("bf16-mixed", device=backend)]


def apply_backend_settings(cfg: BackendConfig, backend: str) -> None:
    if backend == "mlx":
        mx = import_mlx()
        mx.set_default_device(mx.gpu if mlx_device(cfg.device) == "gpu" else mx.cpu)
    torch.set_float32_matmul_precision(cfg.matmul_precision)
    if cfg.cpu_threads:
        torch.set_num_threads(cfg.cpu_threads)
    if backend == "cuda":  # the Trainer (benchmark=None) keeps it, and turns it off itself for deterministic=true
        torch.backends.cudnn.benchmark = cfg.cudnn_benchmark
    check_mps_fallback(cfg, backend)


def check_mps_fallback(cfg: BackendConfig, backend: str) -> None:
    """Refuse `backend.mps_fallback=true` when torch loaded without the fallback: torch reads the variable once, at
    import (sweeplab/core/mps_fallback.py), so no setting made now could act. A fallback the environment turned on
    although the config says false only warns; the run's `mps_fallback` tag says what was in effect."""
    if backend != "mps":
        return
    active = mps_fallback.in_effect()
    if cfg.mps_fallback and not active:
        raise ConfigError(
            "backend.mps_fallback",
            f"true, but torch was imported without {mps_fallback.ENV_VAR}=1 (torch reads it once, at import); pass "
            f"{mps_fallback.OVERRIDE_KEY}=true on the command line (one value, not a sweep) or export "
            f"{mps_fallback.ENV_VAR}=1",
        )
    if active and not cfg.mps_fallback:
        log.warning(
            "backend.mps_fallback=false, but %s is set in this process's environment: ops MPS lacks run on the CPU",
            mps_fallback.ENV_VAR,
        )


def mps_fallback_record(backend: str) -> JobRun:
    """The run tag saying whether ops MPS lacks ran on the CPU (what torch loaded with, not only what was asked)."""
    return JobRun(mps_fallback=mps_fallback.in_effect() if backend == "mps" else None)
