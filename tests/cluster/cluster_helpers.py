"""What the cluster tests share (conftest.py holds the fixtures): the launcher settings for this node, a tiny job,
a sweep running in the background, SLURM's view of a job, the MLflow store's record of a sweep."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from mlflow.tracking import MlflowClient

from sweeplab.tracking import mlflow_store


def slurm(cluster: dict[str, str], name: str, *overrides: str) -> list[str]:
    """hydra/launcher=slurm sized for this node (2 CPUs, no GPU): one CPU per job, so two run at once."""
    return ["hydra/launcher=slurm", f"hydra.launcher.partition={cluster['partition']}",
            "hydra.launcher.gpus_per_node=null", "hydra.launcher.tasks_per_node=1", "hydra.launcher.cpus_per_task=1",
            "hydra.launcher.mem_gb=2", "hydra.launcher.timeout_min=10", f"hydra.launcher.name={name}", *overrides]


def tiny(demo_dir: Path, experiment: str, *overrides: str) -> list[str]:
    """A smoke job (20 steps, validation at 10), a last checkpoint every 5 steps, no system metrics."""
    return ["backend=cpu", "debug=smoke", f"data.path={demo_dir}", "model.out_dim=64", "checkpoint.every_n_steps=5",
            "logger.system_metrics_after_s=null", f"logger.experiment_name={experiment}", *overrides]


def pause(tmp_path: Path, seconds: int) -> dict[str, str]:
    """Every job pauses at its first validation inside fit (step 10) for `seconds`, or until the file goes."""
    return {"SWEEPLAB_FAULT_PAUSE_IN": "validation", "SWEEPLAB_FAULT_PAUSE_S": str(seconds),
            "SWEEPLAB_FAULT_PAUSED_FILE": str(tmp_path / "paused")}


@dataclass
class Sweep:
    """A `python -m sweeplab.train -m ...` running in the background; its output lines with the time each came."""

    process: subprocess.Popen
    lines: list[tuple[float, str]] = field(default_factory=list)

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def wait(self, timeout: float) -> int:
        status = self.process.wait(timeout=timeout)
        self.reader.join(timeout=10)
        return status

    @property
    def output(self) -> str:
        return "\n".join(line for _, line in self.lines)

    def first(self, text: str) -> float | None:
        """When the first line holding `text` came (time.monotonic)."""
        return next((at for at, line in self.lines if text in line), None)


started: list[subprocess.Popen] = []  # every sweep a test started (conftest ends those left at its end)


def start_sweep(cwd: Path, args: list[str], uri: str, env: dict[str, str] | None = None) -> Sweep:
    process = subprocess.Popen([sys.executable, "-m", "sweeplab.train", "-m", *args], cwd=cwd, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               env={**os.environ, "MLFLOW_TRACKING_URI": uri, **(env or {})})
    started.append(process)
    sweep = Sweep(process)
    sweep.reader = threading.Thread(target=sweep._read, daemon=True)
    sweep.reader.start()
    return sweep


def run_sweep(cwd: Path, args: list[str], uri: str, env: dict[str, str] | None = None, timeout: float = 600) -> Sweep:
    sweep = start_sweep(cwd, args, uri, env)
    sweep.wait(timeout)
    return sweep


def pasted(command_line: str) -> list[str]:
    """The arguments of a printed `python -m sweeplab.train -m ...` command, as bash would split it."""
    words = shlex.split(command_line)
    assert words[:4] == ["python", "-m", "sweeplab.train", "-m"], command_line
    return words[4:]


def wait_for(condition, timeout: float, what: str, sweep: Sweep | None = None, period: float = 0.5):
    """condition()'s first true value; fails at the timeout, or at once with its output when `sweep` ended."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (found := condition()):
            return found
        if sweep is not None and sweep.process.poll() is not None:
            sweep.reader.join(timeout=10)
            raise AssertionError(f"the sweep ended ({sweep.process.returncode}) before {what}:\n{sweep.output[-4000:]}")
        time.sleep(period)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def _squeue(*args: str) -> str:
    """squeue's output, asked again for up to 30 s while it fails: at load 13-16 on this 2-core machine one call in
    a test's hundreds failed (exit 1) while the controller was busy, and the test stopped half-way."""
    deadline = time.monotonic() + 30
    while True:
        result = subprocess.run(["squeue", "-h", *args], capture_output=True, text=True)
        if result.returncode == 0 or time.monotonic() > deadline:
            break
        time.sleep(1)
    if result.returncode != 0:
        raise AssertionError(f"squeue {' '.join(args)} failed for 30 s: {result.stderr.strip()}")
    return result.stdout


def jobs_under(folder: Path) -> list[str]:
    """Ids of the queued or running jobs working under `folder` (squeue's %Z: the job's working directory)."""
    return [job for job, _, workdir in (line.partition(" ") for line in _squeue("-o", "%i %Z").splitlines())
            if (workdir + "/").startswith(f"{folder}/")]


def squeue(name: str, states: str = "R") -> list[str]:
    """Ids of the jobs named `name` in these states (`<array id>_<index>`)."""
    out = _squeue("-r", "-n", name, "-t", states, "-o", "%i")
    return [line.strip() for line in out.splitlines() if line.strip()]


def running_with_a_checkpoint(name: str, sweep_dir: Path, job: str | None = None) -> str | None:
    """A running job of the study's first array (`job`, or any) whose folder holds a last checkpoint (its array
    index is its Hydra job number there; a study of one job is submitted as a plain job: folder 0), or None."""
    for job_id in squeue(name) if job is None else [job]:
        if (sweep_dir / (job_id.partition("_")[2] or "0") / "checkpoints" / "last.ckpt").is_file():
            return job_id
    return None


def _job_fields(job_id: str) -> dict[str, str]:
    out = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True).stdout
    return dict(word.partition("=")[::2] for word in out.split() if "=" in word)


def restarts(job_id: str) -> int:
    """How many times SLURM started the job again; a requeued job it holds back is released at once (SLURM makes
    a requeued batch job eligible 2 minutes later, and holds one whose launch failed: the tests do not wait)."""
    fields = _job_fields(job_id)
    if fields.get("JobState") == "PENDING" and fields.get("Reason") == "BeginTime":
        subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], capture_output=True)
    if fields.get("JobState") == "PENDING" and "held" in fields.get("Reason", ""):
        subprocess.run(["scontrol", "release", job_id], capture_output=True)
    return int(fields.get("Restarts", "0") or 0)


def job_processes(job_id: str) -> list[str]:
    """The pids of the node's slurmstepd processes still running the job (`slurmstepd: [<plain id>.batch]`...)."""
    plain = _job_fields(job_id).get("JobId")
    if not plain:
        return []
    out = subprocess.run(["pgrep", "-f", rf"^slurmstepd: \[{plain}\."], capture_output=True, text=True).stdout
    return out.split()


def sweep_runs(uri: str, experiment: str):
    """(the parent runs, the job runs) of an experiment."""
    client = MlflowClient(uri)
    found = client.get_experiment_by_name(experiment)
    runs = client.search_runs([found.experiment_id], max_results=1000) if found else []
    parents = [r for r in runs if r.data.tags.get("sweeplab.role") == "sweep"]
    # a job's run: not the sweep's, a configuration's or the chart's target line (mlflow_store.is_job_run, one rule)
    jobs = [r for r in runs if mlflow_store.is_job_run(r) and r.data.tags.get("mlflow.parentRunId")]
    return parents, jobs


def logged_steps(uri: str, run_id: str, metric: str = "train/loss") -> list[int]:
    return [m.step for m in MlflowClient(uri).get_metric_history(run_id, metric)]
