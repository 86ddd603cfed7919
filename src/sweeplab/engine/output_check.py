"""A Hydra callback that checks the run's (or sweep's) output directory before Hydra itself writes there: writable,
and no symbolic link where Hydra writes.

Hydra creates the directory inside its own error handler, which prints a traceback and exits 1 on a read-only or
foreign path; this runs first and ends in one `error:` line and exit status 2, like every other bad input. Hydra
then writes `.hydra/{config,hydra,overrides}.yaml` and the job's log (`<job name>.log`) into every job's folder, and
`multirun.yaml` into a sweep's, with a plain `open`: a link planted at one of them (a continued study's job folders
are there already) would have its target overwritten, so it is refused here (`core/files.refuse_links`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from sweeplab.core.errors import exit_on_user_error
from sweeplab.core.files import check_writable_dir, refuse_links

HYDRA_FILES = ("config.yaml", "hydra.yaml", "overrides.yaml")  # what run_job writes into hydra.output_subdir
MULTIRUN_FILE = "multirun.yaml"  # what a sweep writes into hydra.sweep.dir


class WritableOutputDir(Callback):
    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        _check(config.hydra.run.dir, hydra_writes(Path(config.hydra.run.dir), config))

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        jobs = [p for p in sweep_dir.iterdir() if p.name.isdigit()] if sweep_dir.is_dir() else []
        _check(sweep_dir, [sweep_dir / MULTIRUN_FILE, *jobs,
                           *(path for job in jobs if not job.is_symlink() for path in hydra_writes(job, config))])


def hydra_writes(folder: Path, config: DictConfig) -> list[Path]:
    """The paths Hydra writes in a job's folder: its output subdir and the files in it, and the job's log."""
    subdir = OmegaConf.select(config, "hydra.output_subdir", default=None)
    job_name = OmegaConf.select(config, "hydra.job.name", default=None) or "train"
    written = [folder / f"{job_name}.log"]
    if subdir is not None:
        written += [folder / subdir, *(folder / subdir / name for name in HYDRA_FILES)]
    return written


def _check(directory: str | Path, written: list[Path]) -> None:
    try:
        check_writable_dir(directory)
        refuse_links(written, "Hydra")
    except Exception as exc:  # an OSError of the folder, a link: one line (anything else keeps its traceback)
        exit_on_user_error(exc)
