"""Which combinations of settings can run, in one place. plan() calls these before any run exists; each refusal is a
ConfigError naming the key. (The backend's own rules, precision, compile and devices, are backends.check_combination.)
"""

from __future__ import annotations

import importlib.util
import logging

import torch

from sweeplab.core.errors import ConfigError
from sweeplab.core.records import JOB
from sweeplab.families.contract import serves_steps_per_batch
from sweeplab.runtime import backends

log = logging.getLogger(__name__)


def check_steps_per_batch(
    k: int, cuda_graph: bool, container: dict, trainer, checkpoint, guard: dict, timing: dict, tune, datamodule,
) -> None:
    """steps_per_batch=k > 1 runs k optimizer steps per training batch, and Lightning acts only between batches:
    every step count that decides something (stop, validate, log, checkpoint, check for non-finite values, the
    timer's warm-up and windows) must fall on a batch's edge, or the run would do it at another step than it says."""
    data = container["data"]
    if not data.get("on_device", False) or not serves_steps_per_batch(datamodule):
        raise ConfigError("steps_per_batch", f"a batch of {k} optimizer steps takes its rows from data.on_device=true "
                          f"(model.family={container['model'].get('family')!r} with data.on_device={data.get('on_device')})")
    if data.get("pad_to") != "max":
        raise ConfigError("steps_per_batch", f"a batch of {k} optimizer steps needs one batch width; set data.pad_to=max")
    if guard.get("mode") == "skip":
        raise ConfigError("guard.mode", f"skip cannot drop one step inside a batch of steps_per_batch={k}; use stop")
    if tune.batch_size:
        raise ConfigError("tune.batch_size", f"the batch-size search steps one batch at a time; unset it with steps_per_batch={k}")
    max_steps = trainer.max_steps
    intervals = {
        JOB.max_steps: max_steps,  # the config key, logged as the param of that name
        "trainer.val_check_interval": trainer.val_check_interval,
        "trainer.log_every_n_steps": trainer.log_every_n_steps,
        **({"checkpoint.every_n_steps": checkpoint.every_n_steps} if checkpoint.every_n_steps is not None else {}),
        "timing.warmup_steps": timing.get("warmup_steps", 0),
        "timing.window": timing.get("window", 1),
        "timing.trace_steps": timing.get("trace_steps", 0),
    }
    if guard.get("mode") == "stop":
        intervals["guard.check_every_n_steps"] = guard.get("check_every_n_steps", 1)
    for key, steps in intervals.items():
        # an interval longer than the run never fires inside it (the bench's "no periodic checkpoint")
        if steps % k and not (key != JOB.max_steps and steps > max_steps):
            raise ConfigError(key, f"{steps} is not a multiple of steps_per_batch={k}: a batch of {k} steps cannot stop between them")
    warmup = timing.get("warmup_steps", 0)
    if cuda_graph and warmup < 2 * k:
        raise ConfigError("timing.warmup_steps", f"{warmup} < {2 * k}: with cuda_graph and steps_per_batch={k} the first "
                          f"{k} steps run eagerly and the next {k} capture the graph; neither may be timed")


def check_speed_switches(model_config, backend: str, compile_mode: str) -> list[str]:
    """The LM speed switches (`model.lm_loss`, `model.float8`, `model.attention`; models/gpt.py) where they cannot
    run. A model config without them (a family without an LM head) cannot be given them: Hydra refuses the key.
    Returns the warnings logged."""
    lm_loss = getattr(model_config, "lm_loss", "full")
    float8 = getattr(model_config, "float8", "none")
    attention = getattr(model_config, "attention", "auto")
    warnings: list[str] = []
    if backend == "mlx":
        for key, value, default in (("lm_loss", lm_loss, "full"), ("float8", float8, "none"), ("attention", attention, "auto")):
            if value != default:
                raise ConfigError(f"model.{key}", f"{value} is a PyTorch training switch; backend=mlx has its own port: use model.{key}={default}")
        return warnings
    if lm_loss == "liger":
        if backend != "cuda":
            raise ConfigError("model.lm_loss", f"liger runs Triton kernels on CUDA (this job runs on {backend}); use model.lm_loss=chunked")
        if not _importable("liger_kernel") or not _importable("triton"):
            raise ConfigError("model.lm_loss", "liger needs Liger-Kernel and Triton: pip install 'sweeplab[speed]', or use model.lm_loss=chunked")
    if attention != "auto" and backend != "cuda":
        raise ConfigError("model.attention", f"{attention} pins a CUDA attention kernel (this job runs on {backend}); use model.attention=auto")
    if float8 != "none":
        if backend != "cuda":
            raise ConfigError("model.float8", f"{float8}: float8 matmuls need an NVIDIA GPU of compute capability >= 8.9 (Hopper, Ada); this job runs on {backend}: use model.float8=none")
        capability = torch.cuda.get_device_capability()
        if capability < (8, 9):
            raise ConfigError("model.float8", f"{float8}: float8 matmuls need compute capability >= 8.9 (Hopper, Ada); "
                              f"{torch.cuda.get_device_name()} has {capability[0]}.{capability[1]}: use model.float8=none")
        if not _importable("torchao"):
            raise ConfigError("model.float8", "float8 training needs torchao: pip install 'sweeplab[speed]', or use model.float8=none")
        if compile_mode == "off":
            message = "model.float8 with compile=off: torchao's scaling and casts run as separate kernels, slower than bf16; use compile=default"
            log.warning("%s", message)
            warnings.append(message)
    return warnings


def _importable(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def check_mlx(p) -> None:
    """What the MLX loop cannot do yet (backend=mlx), refused before any run exists."""
    container = p.container
    backends.mlx_device(p.backend_config.device)  # backend.device=gpu where MLX has none
    if (container.get("data") or {}).get("on_device"):
        raise ConfigError("data.on_device", "keeps batches on a torch device; backend=mlx converts each batch: use false")
    if (container.get("tune") or {}).get("batch_size"):
        raise ConfigError("tune.batch_size", "the batch-size finder is Lightning's; not with backend=mlx")
    if p.timing.get("profile") or p.timing.get("trace_steps"):
        raise ConfigError("timing.profile", "the phase profiler and trace are torch's; not with backend=mlx")
