"""What runs are called in MLflow: a job's run name and description, a sweep's (and the bench's) parent run.

A job's name says what tells it from its neighbours, swept keys first (a narrow name column still shows them): the
sweep callback writes the swept keys to the environment (channels.SWEPT_KEYS_ENV) before the first job, and each
job, wherever it runs, reads them here. Each family supplies the keys its runs always show (`Family.name_keys`);
every key is shown by its short label (sweeplab.core.labels: the family's `labels`, then the engine's), values formatted
with `name_value`. A run's description is the command that runs it again.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from sweeplab import CONF_DIR
from sweeplab.core.channels import SWEPT_KEYS_ENV
from sweeplab.core.labels import label
from sweeplab.core.records import JOB

_NAMED_AT_THE_END = {"backend", "trainer.precision", "compile", "cuda_graph", "steps_per_batch", "model"}
TRAIN_COMMAND = "python -m sweeplab.train"
NO_SWEPT_KEY = "(no swept key)"  # the configuration of a sweep of replicates only


def study_overrides(overrides: Iterable[str]) -> list[str]:
    """A sweep's command-line overrides without those that may differ when it is continued (`resume`)."""
    return sorted(o for o in overrides if o.partition("=")[0].lstrip("+~") != "resume")


def overrides_tag(overrides: Iterable[str]) -> str:
    """A sweep's command-line overrides as its run records them (tag `sweep_overrides`): shell-quoted, so an
    override holding spaces or quotes (`+label='a b c'`) reads back as the very string Hydra was given."""
    return shlex.join(overrides)


def recorded_overrides(tag: str) -> list[str]:
    """The overrides `overrides_tag` recorded (a tag written before it quoted them: split at spaces)."""
    try:
        return shlex.split(tag)
    except ValueError:  # an unbalanced quote: an older, unquoted record
        return tag.split()


def continue_command(overrides: Iterable[str], sweep_dir: str | os.PathLike, launcher: Iterable[str] = ()) -> str:
    """The command that continues an interrupted sweep in `sweep_dir` under its own parent run; `launcher`: the
    sweep's launcher and sweeper overrides (`launcher_overrides`), so that it runs where the sweep ran."""
    return shlex.join([*TRAIN_COMMAND.split(), "-m", *launcher, *study_overrides(overrides),
                       f"hydra.sweep.dir={hydra_quote(str(sweep_dir))}", "resume=true"])


def hydra_quote(value: str) -> str:
    """`value` as Hydra's override grammar reads it back whole: as it is when it holds only plain path characters,
    else single-quoted with its quotes (and the backslashes before a quote or the end) escaped. A folder with a space
    or a quote, only shell-quoted, reached Hydra as several tokens and was refused."""
    if re.fullmatch(r"[\w./:@+-]*", value):
        return value
    escaped = re.sub(r"(\\+)(?='|$)", lambda m: m.group(1) * 2, value).replace("'", "\\'")
    return f"'{escaped}'"


def launcher_overrides(hydra_overrides: Iterable[str]) -> list[str]:
    """Of a command's `hydra.overrides.hydra`: those choosing or setting the launcher and the sweeper
    (`hydra/launcher=slurm`, `hydra.launcher.partition=gpu`, ...), in their order; not Hydra's own (`hydra.mode`)
    nor the sweep's folder (the continue command names it), nor `hydra.sweeper.leave`."""
    kept = ("hydra/launcher", "hydra/sweeper", "hydra.launcher.", "hydra.sweeper.")
    # the continue command watches and finishes a study left running: it does not leave again
    return [o for o in hydra_overrides if o.lstrip("+~").startswith(kept)
            and not o.lstrip("+~").startswith("hydra.sweeper.leave=")]


def name_value(value: Any) -> str:
    """A config value as a run name shows it: floats to 4 significant digits (Optuna samples 0.43728190...)."""
    if isinstance(value, float):
        return f"{value:.4g}"
    try:
        number = float(value)
    except (TypeError, ValueError):
        return str(value)
    return str(value) if str(value).lstrip("-").isdigit() else f"{number:.4g}"


def swept_keys(config: DictConfig) -> list[str]:
    """Keys whose value differs between the jobs: the sweeper's params and comma/range/choice overrides."""
    keys = list((OmegaConf.select(config, "hydra.sweeper.params") or {}).keys())
    for override in OmegaConf.select(config, "hydra.overrides.task") or []:
        key, _, value = override.lstrip("+~").partition("=")
        if ("," in value or value.startswith(("range(", "choice(", "interval(", "glob("))) and key not in keys:
            keys.append(key)
    return keys


def _job_overrides() -> list[str] | None:
    """This job's command-line overrides (the sweeper's sample for Optuna); None outside Hydra."""
    try:
        from hydra.core.hydra_config import HydraConfig

        return list(HydraConfig.get().overrides.task)
    except ValueError:  # not under Hydra (tests, notebooks, bench, profile)
        return None


def _swept_values() -> dict[str, str]:
    """{key: value} of this job's swept keys, as its overrides set them."""
    swept = [k for k in os.environ.get(SWEPT_KEYS_ENV, "").split(",") if k]
    if not swept:
        return {}
    values = {}
    for override in _job_overrides() or []:
        key, _, value = override.lstrip("+~").partition("=")
        if key in swept:
            values[key] = value
    return values


def config_key() -> str:
    """A sweep job's configuration as its swept values, "key=value ..." in the swept keys' order: the same in every
    replicate of it (the seed a replicate sets is not a swept key), so the verdict groups its jobs by it. "(no
    swept key)" for a sweep of replicates only."""
    return " ".join(f"{key}={value}" for key, value in _swept_values().items()) or NO_SWEPT_KEY


def config_values(key: str) -> dict[str, str]:
    """A configuration's swept values back from its `config_key` ("data.batch_size=64 loss.alpha=0.7" ->
    {"data.batch_size": "64", "loss.alpha": "0.7"}); {} for a sweep of replicates only."""
    if key == NO_SWEPT_KEY:
        return {}
    parts = re.split(r"\s+(?=[^\s=]+=)", key.strip())
    return dict(part.partition("=")[::2] for part in parts if "=" in part)


def configuration_run_names(keys: Iterable[str], family_labels: Mapping[str, str] | None = None) -> dict[str, str]:
    """{config_key: short name}: the swept values by their short labels ("bs=64 α=0.7"), as job run names show them;
    the whole key where two configurations would read alike (two keys sharing a label)."""
    keys = list(keys)
    short = {
        key: " ".join(f"{label(k, family_labels)}={name_value(v)}" for k, v in config_values(key).items()) or key
        for key in keys
    }
    clashes = {name for name in short.values() if list(short.values()).count(name) > 1}
    return {key: key if name in clashes else name for key, name in short.items()}


def _conf_default(group_file: str, key: str) -> Any:
    """A key's value in one of conf/'s group files (what a run without overrides or presets gets)."""
    try:
        return OmegaConf.select(OmegaConf.load(Path(CONF_DIR) / group_file), key)
    except Exception:
        return None


def run_name(p, cfg: DictConfig, replicate: int | None = None) -> str:
    """A job's run name (p: its training.JobPlan): swept keys first (and in a replicated sweep the replicate,
    `rep=1`, counted from 0 as its tag; the job's place, core/place.py), then the family and its own keys, a non-default model size or step budget,
    and the backend's settings."""
    family_parts = {k: v for k, v in p.family.run_name_parts(cfg).items() if v}
    swept = _swept_values()
    parts = []
    for key, value in swept.items():
        if key not in _NAMED_AT_THE_END:
            short = label(key, p.family.labels)
            parts.append(family_parts.pop(key, None) or f"{short}={name_value(value)}")
    if cfg.get("replicates", 1) != 1 and replicate is not None:  # the replicates of a configuration apart
        parts.append(f"rep={replicate}")
    parts.append(p.family.name)
    size = OmegaConf.select(cfg, "model.size")
    if "model.size" not in swept and size is not None and size != _conf_default(f"model/{p.family.name}.yaml", "size"):
        parts.append(str(size))
    parts += family_parts.values()
    if JOB.max_steps not in swept and p.trainer.max_steps != _conf_default("trainer/default.yaml", "max_steps"):
        parts.append(f"{label(JOB.max_steps)}={p.trainer.max_steps}")
    parts.append(p.backend)
    if p.trainer.precision != "32-true":
        parts.append(p.trainer.precision)
    if p.compile_mode != "off":
        parts.append(f"compile={p.compile_mode}")
    if p.cuda_graph:
        parts.append("cuda_graph")
    if p.steps_per_batch > 1:
        parts.append(f"steps_per_batch={p.steps_per_batch}")
    return " ".join(parts)


def run_description() -> str | None:
    """A job's note in the MLflow UI: how to run it again (its command-line overrides); None outside Hydra."""
    overrides = _job_overrides()
    if overrides is None:
        return None
    return shlex.join([*TRAIN_COMMAND.split(), *overrides])


def failed_job_name(family: str) -> str:
    """The run of a sweep job that failed before its own run existed (a config or data error)."""
    return f"{family} (failed before training)"


def sweep_id(sweep_dir: str | Path | None) -> str:
    """A sweep's one name: its multirun dir's last two parts (`2026-11-24/13-39-32`), the same in the parent run's
    name, the `sweep_id` tag of the parent and of every job, and the report's heading; "" outside a sweep."""
    if not sweep_dir:
        return ""
    path = Path(sweep_dir)
    return f"{path.parent.name}/{path.name}" if path.parent.name else path.name


def sweep_run_name(sweep_dir: Path) -> str:
    """A sweep's parent run: `sweep <sweep id>`."""
    return f"sweep {sweep_id(sweep_dir)}"


def sweep_description(overrides: list[str]) -> str:
    """A sweep's note in the MLflow UI: the command that launches it again."""
    return shlex.join([*TRAIN_COMMAND.split(), "-m", *overrides])


def bench_run_name(out_dir: Path) -> str:
    """`sweeplab.bench`'s parent run: its output dir's name (the time it started)."""
    return f"bench {out_dir.name}"
