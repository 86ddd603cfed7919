"""Which combinations of settings can run, in one place. plan() calls these before any run exists; each refusal is a
ConfigError naming the key. (The backend's own rules, precision, compile and devices, are backends.check_combination.)
"""

from __future__ import annotations

from sweeplab.core.errors import ConfigError
from sweeplab.families.contract import serves_steps_per_batch
from sweeplab.runtime import backends


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
        "trainer.max_steps": max_steps,
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
        if steps % k and not (key != "trainer.max_steps" and steps > max_steps):
            raise ConfigError(key, f"{steps} is not a multiple of steps_per_batch={k}: a batch of {k} steps cannot stop between them")
    warmup = timing.get("warmup_steps", 0)
    if cuda_graph and warmup < 2 * k:
        raise ConfigError("timing.warmup_steps", f"{warmup} < {2 * k}: with cuda_graph and steps_per_batch={k} the first "
                          f"{k} steps run eagerly and the next {k} capture the graph; neither may be timed")


def check_mlx(p) -> None:
    """What the MLX loop cannot do yet (backend=mlx), refused before any run exists."""
    container = p.container
    backends.mlx_device(p.backend_config.device)  # backend.device=gpu where MLX has none
    if container.get("resume") not in (False, None):
        raise ConfigError("resume", "backend=mlx does not resume runs yet; start a new run (resume=false)")
    if (container.get("data") or {}).get("on_device"):
        raise ConfigError("data.on_device", "keeps batches on a torch device; backend=mlx converts each batch: use false")
    if (container.get("tune") or {}).get("batch_size"):
        raise ConfigError("tune.batch_size", "the batch-size finder is Lightning's; not with backend=mlx")
    if p.timing.get("profile") or p.timing.get("trace_steps"):
        raise ConfigError("timing.profile", "the phase profiler and trace are torch's; not with backend=mlx")
