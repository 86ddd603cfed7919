"""The sweeplab sweeper's own use of submitit, for the submitit launchers (hydra/launcher=slurm, submitit_slurm,
submitit_local): a launch's jobs are submitted without blocking (one job array), then watched here every
WATCH_PERIOD_S seconds until each has ended; a job the scheduler ended (cancelled, timed out, failed outside Python,
a node failure, out of memory) is handed to `on_lost` and the others go on.

Why not the launcher's own `launch()`: hydra-submitit-launcher blocks on `job.results()`, whose watcher asks `sacct`
every age/2 seconds up to 10 minutes (a job cancelled 9 minutes into a sweep went unnoticed for minutes), and raises
`UncompletedJobError` for the first job that produced no result, which ended the whole sweep with a traceback. The
submission itself is the launcher's: the same executor, parameters, array and job callable
(BaseSubmititLauncher.__call__, which runs the Hydra job), wrapped in `ResumingJob`.

`ResumingJob` is what each SLURM job runs: submitit's checkpointable callable. When SLURM runs a job again
(`scontrol requeue`, preemption, or submitit's own requeue at a time limit through `checkpoint()` with
`hydra.launcher.max_num_timeout` > 0), the job finds its own output folder's last checkpoint and continues its own
MLflow run from there (`resume=<its folder>`: sweeplab.engine.training resumes the run the checkpoint names, and
its logger skips the steps that run already holds), rather than training again into a second run.

What `sacct` alone misreads, the watch checks against `squeue` (the controller's queue, one call a look):
- a pending array task cancelled before it started (`scancel <array>_<i>`): SLURM 22.05 keeps no accounting record
  of it, so submitit reads UNKNOWN ("not done") for ever. A job neither queued nor in `sacct` on two looks in a row
  was cancelled before it started (`gone_before_starting`).
- a job ended by a node failure that SLURM requeues (`JobRequeue=1`): `sacct` reads NODE_FAIL (an end) while the
  same job id waits in the queue to run again. A job still queued is still out (`requeued`); its end is read again
  from `sacct` once it has left the queue.
"""

# no `from __future__ import annotations`: Hydra scans this package with a loader under which dataclasses cannot
# resolve string annotations
import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn, JobStatus

from sweeplab.core import channels
from sweeplab.core.files import append_no_follow
from sweeplab.sweep import launchers

log = logging.getLogger(__name__)

WATCH_PERIOD_S = 5.0  # how often the round's jobs are looked at (one forced `sacct` and one `squeue` for all)
GONE_LOOKS = 2  # looks in a row a job must be missing from both the queue and accounting to count as cancelled
REQUEUED_ENDS = ("NODE_FAIL", "BOOT_FAIL")  # ends after which SLURM (JobRequeue=1) queues the same job id again
CANCELLED_BEFORE_STARTING = "no longer queued and no accounting record: cancelled before it started"
RESTART_COUNT_ENV = "SLURM_RESTART_COUNT"  # SLURM sets it in a job it runs again (requeue, preemption)


@dataclass(frozen=True)
class SubmittedJob:
    """One job of a launch: Hydra's job number (its folder under the sweep dir), its overrides, submitit's Job."""

    number: int
    overrides: tuple[str, ...]
    job: Any

    @property
    def scheduler_id(self) -> str:
        """The scheduler's id of the job (`<array id>_<index>` for a SLURM array task: what sacct and scancel take)."""
        return str(self.job.job_id)


@dataclass(frozen=True)
class LostJob:
    """A job that ended without a result: the scheduler's final `state` (CANCELLED, TIMEOUT, NODE_FAIL,
    OUT_OF_MEMORY, FAILED, ...; submitit_local: INTERRUPTED) and submitit's explanation, when it gave one."""

    number: int
    scheduler_id: str
    state: str
    overrides: tuple[str, ...]
    reason: str = ""


class LostJobError(RuntimeError):
    """The return value of a lost job's JobReturn (status FAILED), as Hydra's launchers return a job's exception."""


class ResumingJob:
    """The launcher's job callable, run by submitit in the job; checkpointable, and resuming when run again."""

    def __init__(self, launcher: Any) -> None:
        self.launcher = launcher

    def __call__(self, sweep_overrides: list[str], job_dir_key: str, job_num: int, job_id: str,
                 singleton_state: dict) -> JobReturn:
        if int(os.environ.get(RESTART_COUNT_ENV) or 0) > 0:
            folder = self._output_dir(sweep_overrides, job_dir_key, job_num, singleton_state)
            sweep_overrides = resumed_overrides(sweep_overrides, folder)
        return self.launcher(sweep_overrides, job_dir_key, job_num, job_id, singleton_state)

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        """submitit, at a time limit or preemption signal: run the same call again once requeued (it resumes)."""
        import submitit

        return submitit.helpers.DelayedSubmission(self, *args, **kwargs)

    def _output_dir(self, overrides: list[str], job_dir_key: str, job_num: int, singleton_state: dict) -> Path:
        """The job's output folder, as Hydra's run_job computes it (`hydra.sweep.dir` / `hydra.sweep.subdir`)."""
        from hydra.core.singleton import Singleton
        from hydra.core.utils import setup_globals
        from omegaconf import OmegaConf, open_dict

        Singleton.set_state(singleton_state)
        setup_globals()
        config = self.launcher.hydra_context.config_loader.load_sweep_config(self.launcher.config, list(overrides))
        with open_dict(config.hydra.job):
            config.hydra.job.num = job_num
        return Path(str(OmegaConf.select(config, job_dir_key))) / str(OmegaConf.select(config, "hydra.sweep.subdir"))


def resumed_overrides(overrides: Sequence[str], output_dir: Path) -> list[str]:
    """A job run again by the scheduler: `resume=<its folder>` when that folder holds a last checkpoint (the run it
    started continues there), unless it already continues an interrupted run (`resume=true`: found again the same
    way); otherwise the overrides as they were (nothing to resume: it starts afresh)."""
    if "resume=true" in overrides or not (output_dir / "checkpoints" / "last.ckpt").is_file():
        return list(overrides)
    log.info("resume: this job was started again by the scheduler; continuing its run from %s", output_dir)
    from sweeplab.tracking.naming import hydra_quote

    return [*(o for o in overrides if o.partition("=")[0].lstrip("+~") != "resume"),
            f"resume={hydra_quote(str(output_dir))}"]


def drives(launcher: Any) -> bool:
    """The launcher is one of hydra-submitit-launcher's (SLURM, local): the sweeper submits and watches itself."""
    return launchers.can(launcher).submits


def outlives_this_process(launcher: Any) -> bool:
    """The launcher's jobs run on when the launching process exits (SLURM's; submitit_local's die with it)."""
    return launchers.can(launcher).outlives_sweeper


def executor(launcher: Any) -> Any:
    """submitit's executor with the launcher's settings, as BaseSubmititLauncher.launch builds it."""
    import submitit
    from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
    from omegaconf import OmegaConf

    kind, params = launchers.can(launcher).cluster, launcher.params
    init_keys = {"max_num_timeout"}
    built = submitit.AutoExecutor(cluster=kind, folder=params["submitit_folder"],
                                  **{f"{kind}_{k}": v for k, v in params.items() if k in init_keys})
    shared = set(OmegaConf.structured(BaseQueueConf).keys())
    built.update_parameters(**{k if k in shared else f"{kind}_{k}": v for k, v in params.items()
                               if k not in init_keys | {"submitit_folder"}})
    return built


def submit(launcher: Any, batch: Sequence[Sequence[str]], initial_job_idx: int) -> list[SubmittedJob]:
    """Submit a launch's jobs (one array) and return at once."""
    from hydra.core.singleton import Singleton
    from hydra.core.utils import filter_overrides

    sweep_dir = Path(str(launcher.config.hydra.sweep.dir))
    sweep_dir.mkdir(parents=True, exist_ok=True)
    if "mode" in launcher.config.hydra.sweep:
        os.chmod(sweep_dir, mode=int(str(launcher.config.hydra.sweep.mode), 8))
    numbers = [initial_job_idx + i for i in range(len(batch))]
    for number, overrides in zip(numbers, batch):
        log.info("\t#%d : %s", number, " ".join(filter_overrides(overrides)))
    state = Singleton.get_state()
    arguments = [(list(o), "hydra.sweep.dir", n, f"job_id_for_{n}", state) for n, o in zip(numbers, batch)]
    jobs = executor(launcher).map_array(ResumingJob(launcher), *zip(*arguments))
    submitted = [SubmittedJob(n, tuple(o), j) for n, o, j in zip(numbers, batch, jobs)]
    with append_no_follow(sweep_dir / channels.SUBMITTED_JOBS_FILE, "the submitted-jobs record") as record:  # what is out and where, for a later command
        for job in submitted:
            record.write(json.dumps({"number": job.number, "scheduler_id": job.scheduler_id,
                                     "cluster": launchers.can(launcher).cluster,
                                     "folder": launcher.params["submitit_folder"],
                                     "overrides": list(job.overrides)}) + "\n")
    log.info("sweep: submitted jobs %s as %s (%s)", _span(numbers), ", ".join(s.scheduler_id for s in submitted),
             launchers.can(launcher).cluster)
    return submitted


def submitted_before(sweep_dir: Path) -> list[dict]:
    """The SLURM jobs an earlier process of this sweep submitted (channels.SUBMITTED_JOBS_FILE), as recorded."""
    path = Path(sweep_dir) / channels.SUBMITTED_JOBS_FILE
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []
    return [record for record in records if record.get("cluster") == "slurm"]  # a local job dies with its process


def still_out(sweep_dir: Path) -> list[SubmittedJob]:
    """The SLURM jobs this sweep submitted that have not ended: a study left running (`hydra.sweeper.leave=true`),
    or whose launching process died. submitit's Job, re-made from its id and folder."""
    import submitit

    out: list[SubmittedJob] = []
    queued = queued_states()
    for record in submitted_before(sweep_dir):
        job = submitit.SlurmJob(folder=record["folder"], job_id=record["scheduler_id"])
        if not job.done(force_check=not out) or requeued(job, queued):
            out.append(SubmittedJob(int(record["number"]), tuple(record["overrides"]), job))
    return out


def watch_still_out(sweep_dir: Path, on_lost: Callable[[LostJob], None]) -> bool:
    """A continued study's jobs still queued or running on SLURM (it was left running, or its launching process died)
    watched to their end before anything is planned, so that none is submitted twice; a lost one goes to `on_lost`
    (and is run again like any interrupted job). True when an earlier process submitted SLURM jobs: what the study
    read of them when it was reopened may be out of date (a job ended since), it reads them again."""
    if not submitted_before(sweep_dir):
        return False
    out = still_out(sweep_dir)
    if out:
        log.info("sweep: %d jobs of this study are still out (%s): watching them first", len(out),
                 ", ".join(job.scheduler_id for job in out))
        watch(out, on_lost)
    return True


def watch(submitted: Sequence[SubmittedJob], on_lost: Callable[[LostJob], None],
          period_s: float = WATCH_PERIOD_S) -> list[JobReturn]:
    """Wait for every job; each one's JobReturn in submission order. A lost job is given to `on_lost` as soon as
    it is seen (within `period_s` of the scheduler's record of its end) and returns a FAILED JobReturn."""
    returns: dict[int, JobReturn] = {}
    waiting = list(submitted)
    missing: dict[str, int] = {}  # scheduler id -> looks in a row it was neither queued nor in sacct
    while waiting:
        queued = queued_states() if any(job.job.__class__.__name__ == "SlurmJob" for job in waiting) else None
        for position, job in enumerate(list(waiting)):
            # one forced sacct refreshes the watcher's states of every job of the sweep; the others read them
            if not job.job.done(force_check=position == 0):
                if gone_before_starting(job, queued, missing):
                    waiting.remove(job)
                    returns[job.number] = _lost(job, "CANCELLED", CANCELLED_BEFORE_STARTING, on_lost)
                continue
            if requeued(job.job, queued):  # ended by a node failure, and queued again under the same id
                continue
            waiting.remove(job)
            returns[job.number] = _outcome(job, on_lost)
        if waiting:
            time.sleep(period_s)
    return [returns[job.number] for job in submitted]


def queued_states() -> dict[str, str] | None:
    """`squeue`'s state of each job of this user in the controller's queue (array tasks one by one, `<array>_<i>`);
    None when the controller could not be asked (nothing is concluded from that look)."""
    import getpass
    import subprocess

    try:
        out = subprocess.run(["squeue", "-h", "-r", "-u", getpass.getuser(), "-o", "%i %T"], capture_output=True,
                             text=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        log.debug("squeue failed: %s", exc)
        return None
    return dict(line.split(maxsplit=1) for line in out.splitlines() if len(line.split()) == 2)


def accounted_state(scheduler_id: str) -> str | None:
    """The job's state in SLURM's accounting now (`sacct`, this job alone, its latest attempt); "" when sacct holds
    no record of it; None when sacct could not be asked."""
    import subprocess

    try:
        out = subprocess.run(["sacct", "-n", "-X", "-P", "-o", "JobID,State", "-j", scheduler_id],
                             capture_output=True, text=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        log.debug("sacct failed: %s", exc)
        return None
    states = [line.split("|")[1] for line in out.splitlines() if line.split("|")[0] == scheduler_id]
    return states[-1].split()[0] if states else ""


def gone_before_starting(job: SubmittedJob, queued: dict[str, str] | None, missing: dict[str, int]) -> bool:
    """The job, "not done" for submitit, is neither in the queue nor in accounting on GONE_LOOKS looks in a row: it
    was cancelled before it started (SLURM 22.05 records no pending array task cancelled)."""
    if queued is None or job.scheduler_id in queued or job.job.paths.result_pickle.exists():
        missing.pop(job.scheduler_id, None)
        return False
    if accounted_state(job.scheduler_id) != "":  # recorded (submitit reads it at its next look) or sacct failed
        missing.pop(job.scheduler_id, None)
        return False
    missing[job.scheduler_id] = missing.get(job.scheduler_id, 0) + 1
    return missing[job.scheduler_id] >= GONE_LOOKS


def requeued(job: Any, queued: dict[str, str] | None) -> bool:
    """A job submitit reads as ended without a result, still in the controller's queue: SLURM requeued it (a node
    failure, REQUEUED_ENDS, with `JobRequeue=1`; or submitit's requeue at the time limit) and the same id runs again.
    Once it has left the queue its end is read afresh (submitit stops asking about a job it saw end)."""
    if queued is None or job.paths.result_pickle.exists() or job.__class__.__name__ != "SlurmJob":
        return False
    job_id = str(job.job_id)
    if queued.get(job_id) == "COMPLETING":  # its end is being recorded: read it once it has left the queue
        return True
    # queued again under the same id: after a node failure (REQUEUED_ENDS), or after submitit requeued it at its
    # time limit (its step then reads FAILED, exit 255, for a moment while the job waits PENDING again)
    if job_id in queued:
        if job_id not in _requeued:
            log.info("sweep: scheduler job %s ended %s and SLURM queued it again (%s): still watching it", job_id,
                     job.state, queued[job_id])
            _requeued.add(job_id)
        return True
    if job_id in _requeued:
        _requeued.discard(job_id)
        job.watcher._finished.discard(job_id)  # submitit's cache of its first end: ask sacct about it again
        return not job.done(force_check=True)
    return False


_requeued: set[str] = set()  # jobs seen queued again after submitit read their end


def _outcome(job: SubmittedJob, on_lost: Callable[[LostJob], None]) -> JobReturn:
    state = str(job.job.state or "UNKNOWN").split()[0]  # "CANCELLED by 0" -> CANCELLED
    reason = ""
    if job.job.paths.result_pickle.exists() or state in ("COMPLETED", "FINISHED"):
        failure = job.job.exception()  # waits a little for a result file a shared filesystem shows late
        if failure is None:
            return job.job.result()
        reason = str(failure).strip().splitlines()[0][:300]
        state = state if state not in ("COMPLETED", "FINISHED") else "FAILED"
    return _lost(job, state, reason, on_lost)


def _lost(job: SubmittedJob, state: str, reason: str, on_lost: Callable[[LostJob], None]) -> JobReturn:
    on_lost(LostJob(job.number, job.scheduler_id, state, job.overrides, reason))
    lost = JobReturn(overrides=list(job.overrides), status=JobStatus.FAILED)
    lost.return_value = LostJobError(f"job {job.number} ({job.scheduler_id}) ended {state}")  # raised when read
    return lost


def _span(numbers: Sequence[int]) -> str:
    return f"{numbers[0]}-{numbers[-1]}" if len(numbers) > 1 else str(numbers[0])
