"""Every channel that carries state between sweeplab's processes, or between parts of one process that cannot call
each other: each name once, with who writes it, who reads it and why it travels this way.

A sweep's jobs run in the launching process (Hydra's basic launcher), in joblib/loky workers, in submitit jobs on
other hosts, or as DDP ranks that re-run the command line (sweeplab.runtime.distributed). None of them gets a Python object
from the sweep: they inherit its environment, and some see its sweep directory. Inside one process, Hydra's
callbacks and sweeplab's entry point share no call path either (a Hydra callback returns nothing to the app), so
the few facts they exchange are module attributes here, set and read as `channels.<name>`.

Not listed: the launchers' own rank variables (torchrun, Lightning, SLURM), which sweeplab.runtime.distributed reads and
restores between jobs (`RANK_ENV_VARS`, `LAUNCH_ENV_VARS`); they are the launchers' protocol, not sweeplab's. Nor
the files Hydra writes in the sweep dir for itself (multirun.yaml), nor settings sweeplab gives
a library for its own use (console.py's quiet Kineto and Hugging Face, mps_fallback.py's PYTORCH_ENABLE_MPS_FALLBACK,
HYDRA_FULL_ERROR), nor the cluster test harness's SWEEPLAB_CLUSTER_* (scripts/test_cluster.sh -> tests/cluster/).
"""

from __future__ import annotations

from typing import Any

# --- environment: the sweep's process -> its jobs -----------------------------------------------------------------
# The keys whose values differ between the sweep's jobs, comma-separated. Written by the study when it opens, before the
# first job (sweep.study.Study.open); read by every job's run naming (tracking/naming.run_name),
# so a run's name starts with what tells it from its neighbours. The environment, as a job's own config cannot say
# which of its values were swept.
SWEPT_KEYS_ENV = "SWEEPLAB_SWEPT_KEYS"

# The pid of the `python -m sweeplab.train` process that launched the jobs. Written by sweeplab.train.run; read by
# each job (core.orphans.watch_launcher): a job running in a pool worker (joblib) watches it and ends with it.
LAUNCHER_PID_ENV = "SWEEPLAB_LAUNCHER_PID"

# "<sweep start time> <number of jobs>[ <number of its first job>]". Written by the study when it opens, before the first
# job (a continued sweep: the jobs it still runs, numbered from after its existing folders); read by each job's
# process for its progress line (sweep.progress.progress_line): a joblib worker or a submitit job has no
# other way to know when the sweep started and how many jobs it has.
SWEEP_PROGRESS_ENV = "SWEEPLAB_SWEEP_PROGRESS"

# The sweep's MLflow parent run id (the study's sweep run), for the jobs' processes. Written by the study once it
# created or reopened its sweep run (sweep.study.Study, which removes it when it closes the run); read by each job
# (tracking/mlflow_store.read_parent_run_id) to nest its run under the sweep run. The file PARENT_RUN_FILE in the sweep
# dir says the same and wins (it names this very sweep); the environment covers a job that cannot see the sweep dir.
# The sweeper itself never reads it: it holds its study, which knows its run.
PARENT_RUN_ENV = "SWEEPLAB_PARENT_RUN_ID"
# The SLURM jobs a sweep submitted, one JSON line each (Hydra's job number, the scheduler's id, submitit's folder, the
# overrides), in the sweep dir. Appended by the sweeplab sweeper at each submission (sweep/slurm.py: submit); read by a
# continued study (slurm.still_out), which watches the jobs still out instead of submitting them again, and
# named on the sweep run of a study left running. A file: the process that submitted may be long gone.
SUBMITTED_JOBS_FILE = "submitted_jobs.jsonl"
# The same parent run id as a file in the sweep dir. Written by the study with its sweep run; read by each
# job (tracking/mlflow_store.read_parent_run_id), by a continued sweep (sweep.study.reopen_sweep, which reopens
# that run), by `python -m sweeplab.report --multirun-dir` and by order_check. A file: it outlives the process.
PARENT_RUN_FILE = "mlflow_parent_run_id"
# An Optuna search's study (hydra/sweeper=optuna: sweeplab/sweep/search.py), Optuna's
# JournalStorage file in the sweep dir. Written by the search as it asks and tells its trials; read by its
# continuation (`-m ... resume=true`), which reloads the study, runs the trials left RUNNING again under their own
# numbers and values, and asks the rest. A file: the process that ran the search may be long gone.
OPTUNA_JOURNAL_FILE = "optuna_journal.log"
# The search's best trial (parameters, value, its replicates' values), in the sweep dir as Hydra's Optuna plugin wrote
# it. Written by the search at its end; attached to the sweep run's report by the study (sweep.study.Study.finish).
OPTUNA_RESULTS_FILE = "optimization_results.yaml"

# A replicated sweep's place of each job (sweeplab.study.replicates): its replicate r (seed `seed + r`), the round it ran
# in, its configuration's index in the grid (0: the baseline of the verdict), and how many jobs the launcher ran at
# once on its host. Written by the sweeplab sweeper as `hydra.job.env_set` overrides of each job (part of the job's
# config wherever the launcher runs it: in process, joblib workers, submitit jobs; Hydra also sets them in the job's
# environment, which its children inherit). The job reads them once, from that config, into a core/place.JobPlace
# (sweeplab.train.job_place; no other module reads them from os.environ: tests/test_job_place.py) and hands it to
# training's run tags `replicate`, `round`, `config_index`, `concurrent_jobs`, the stop rules (policies/stopping: the
# round's board, the baseline, the quality round) and its outcome; the sweep callback's line that starts a job
# ("configuration 1, replicate 2") reads the same config.
REPLICATE_ENV = "SWEEPLAB_REPLICATE"
ROUND_ENV = "SWEEPLAB_ROUND"
CONFIG_INDEX_ENV = "SWEEPLAB_CONFIG_INDEX"
CONCURRENT_JOBS_ENV = "SWEEPLAB_CONCURRENT_JOBS"
# The GPU slot (block of trainer.devices GPUs) a job of a GPU sweep runs on: (configuration index + round) modulo the
# slots, so no configuration stays on one GPU (replicates.gpu_slot); read by the joblib lanes launcher, by
# distributed.claim_gpus, which takes that slot's GPUs in a process that holds none yet, and by the sweep callback's
# line that starts a job.
GPU_SLOT_ENV = "SWEEPLAB_GPU_SLOT"
# Packing (sweeplab.sweep.packing, hydra/launcher=joblib_gpus with lanes_per_gpu): how many jobs ran side by side on
# each GPU, and the job's configuration's step time measured alone by the launcher's probe (seconds; absent: not
# measured). Written by the sweeplab sweeper as `hydra.job.env_set` overrides (replicates.job_environment); read by
# training.run_tags (tags `lanes_per_gpu`, `solo_step_time_s`), which the packing check
# (study/caveats.py) compares with the packed jobs' step times.
LANES_PER_GPU_ENV = "SWEEPLAB_LANES_PER_GPU"
SOLO_STEP_TIME_ENV = "SWEEPLAB_SOLO_STEP_TIME_S"
# The lane (`<GPU slot>:<worker pid>`) of the joblib lanes launcher that ran a job. Set by the lane's worker before
# each job (joblib_lanes.run_lane); read by training.run_tags (tag `lane`), whose runs give the report's lanes
# timeline (report/figures.py) and the GPUs' idle share.
LANE_ENV = "SWEEPLAB_LANE"

# --- environment: the user (or a test) -> every process of a run or sweep ----------------------------------------
# Where prepared data and token caches go. Set by the user or a test; read by conf/train.yaml
# (`paths.data_dir: ${oc.env:SWEEPLAB_DATA_DIR,data}`) in every job, so all jobs and ranks share one cache.
DATA_DIR_ENV = "SWEEPLAB_DATA_DIR"

# Where the per-GPU lock files of `hydra/launcher=joblib_gpus` live. Set by the user or a test; read by each job's
# process when it claims its GPUs (distributed.gpu_lock_dir): the jobs of one host must agree on one directory.
GPU_LOCK_DIR_ENV = "SWEEPLAB_GPU_LOCK_DIR"

# Where `make ui` serves a local store's UI (http://host:port). Set by the user; read by `make ui` (sweeplab.ui,
# through tracking/mlflow_store.ui_address) and by every address of a run sweeplab prints or records (a job's closing
# line, the report's links: mlflow_store.ui_base), so they agree. Unset: `make ui` serves on 127.0.0.1:5000 and a
# job does not guess.
UI_URL_ENV = "SWEEPLAB_UI_URL"

# Any value but "0": an expected error (one `error:` line, exit 2) prints its traceback above the line. Set by the
# user (or a test) to debug; read by core.errors.report_user_error in every entry point.
TRACEBACK_ENV = "SWEEPLAB_TRACEBACK"

# The MLflow store; MLflow's own variable, which sweeplab reads before the config's logger.tracking_uri
# (tracking/mlflow_store.resolve_uri) so every job of a sweep, wherever it runs, writes to the same store.
TRACKING_URI_ENV = "MLFLOW_TRACKING_URI"

# The GPUs a process may use; CUDA's own variable. Written by a parallel sweep job that claims its GPUs before CUDA
# starts (distributed.claim_gpus); read by CUDA, by the DDP ranks the job starts, and recorded as the job's
# `cuda_visible_devices` tag (sweep.callback's on_job_end).
CUDA_VISIBLE_DEVICES_ENV = "CUDA_VISIBLE_DEVICES"

# Fault injection (callbacks/faults.py says what each does). Set by the reliability tests in the environment of the
# real subprocess or sweep they start; read once per job by FaultInjection.from_env. The environment, not a config
# key: the fault must reach a real child process (and every job of a sweep), and no user config can switch it on.
FAULT_KILL_ENV = "SWEEPLAB_FAULT_KILL_AT_STEP"
FAULT_RAISE_ENV = "SWEEPLAB_FAULT_RAISE_AT_STEP"
FAULT_OOM_ENV = "SWEEPLAB_FAULT_OOM_AT_STEP"
FAULT_NAN_ENV = "SWEEPLAB_FAULT_NAN_GRAD_AT_STEP"
FAULT_PAUSE_ENV = "SWEEPLAB_FAULT_PAUSE_AT_STEP"
FAULT_PAUSE_FINAL_VALIDATION_ENV = "SWEEPLAB_FAULT_PAUSE_AT_FINAL_VALIDATION"
FAULT_PAUSED_FILE_ENV = "SWEEPLAB_FAULT_PAUSED_FILE"  # the file a paused run creates: the test's cue to signal it
FAULT_KILL_IN_VALIDATION_ENV = "SWEEPLAB_FAULT_KILL_IN_VALIDATION_AT_STEP"
FAULT_KILL_AFTER_FIT_ENV = "SWEEPLAB_FAULT_KILL_AFTER_FIT"
FAULT_PAUSE_IN_ENV = "SWEEPLAB_FAULT_PAUSE_IN"  # a stage (setup, validation, checkpointing, export, report): pause there once
FAULT_PAUSE_S_ENV = "SWEEPLAB_FAULT_PAUSE_S"  # how long that pause lasts (seconds; the file's removal ends it early)

# --- environment: a sweeplab process -> a child it starts ---------------------------------------------------------
# The pid the child dies with. Written into the child's environment by core.interrupts.run_child
# (core.orphans.child_env; order_check's sweeps); read and removed by the child's entry point (sweeplab.train.run:
# core.orphans.die_with_parent_if_asked), so a parent killed with -9 leaves no orphan and the child's own children
# are not tied to it. The environment: the child is a new `python -m` process.
PARENT_PID_ENV = "SWEEPLAB_DIE_WITH_PARENT"

# --- environment: `make ui` (sweeplab.ui) -> the MLflow server it starts ---------------------------------------------
# A random token per start. Written by sweeplab.ui.start_server into the server's environment; read by the server's
# app (tracking/ui_server.create_app, in every worker), which answers `GET /health` with it as the header
# UI_TOKEN_HEADER; sweeplab.ui prints its address only when /health answers with its own token, so another program
# holding the port (another UI on another store, any HTTP server) is never taken for the server it started.
UI_TOKEN_ENV = "SWEEPLAB_UI_TOKEN"
UI_TOKEN_HEADER = "X-Sweeplab-UI"

# --- files in the sweep dir: between the jobs of one sweep --------------------------------------------------------
# (PARENT_RUN_FILE and SUBMITTED_JOBS_FILE above travel the same way.)
# A round's board: the time to target of the round's leader and its curve, {"leader_seconds", "configuration",
# "curve"}. Posted by each job of the round that reaches the target (the board keeps the shortest time) and extended
# by the leader at its later validations (policies/stopping.RoundBoard, under a file lock); read by the round's other
# jobs at each validation (policies/stopping.Behind). A file: the jobs of a round run in other processes, at once,
# and on other hosts under SLURM.
ROUND_BOARD_FILE = "stop/round-{round}.json"

# The study's compiler cache: inductor's FX graph and AOTAutograd caches and Triton kernels, in the sweep dir's
# folder COMPILE_CACHE_FOLDER. Set by each job (engine/training.share_compile_cache) as torch's own variable
# TORCHINDUCTOR_CACHE_DIR unless the user set it; written and read by inductor in every job, so a later job of the
# same graph loads what the first compiled, in another process or on another host of a shared file system.
COMPILE_CACHE_DIR_ENV = "TORCHINDUCTOR_CACHE_DIR"
COMPILE_CACHE_FOLDER = "compile_cache"

# hydra/launcher=joblib_gpus's lanes settle which one runs a job with a marker file per job (os.O_EXCL) in a
# `.lanes-*` folder of the sweep dir (sweeplab/sweep/lanes.py), removed after the launch.

# --- module attributes: between parts of one process ---------------------------------------------------------------
# The MLflow run of the job this process ran last. Written by tracking/mlflow_store.JobRun when it creates or
# reopens a run (None again via mlflow_store.forget_current_run); read by the sweep callback's on_job_end, which
# records the job's return value on that run: Hydra hands the callback the return value but not the run.
job_run_id: str | None = None

# The study whose sweep run is open in this process (None when none is). Written by sweep.study.Study when it opens
# and closes its sweep run; read by sweep.study.end_open_study, which the entry point (sweeplab.train) calls after
# Ctrl-C, SIGTERM or a failure outside the jobs: Hydra runs no callback when a job raises an interrupt, and a sweeper
# that raises never returns to the callback that opened a study for it.
open_sweep: Any = None

# Failed jobs of the last sweep in this process. Written by the study when it finishes (sweep.study.Study.finish);
# read by the entry point (sweeplab.train.run), which exits non-zero when it is > 0: Hydra's multirun returns nothing
# to the app.
failed_jobs: int = 0
# ... and the line that says why, when the study knows better than a count ("sweep: 2 job(s) cancelled (...);
# ... Continue the study with: ..."): written by the study with failed_jobs; printed last by the entry point instead
# of its count of failed jobs.
failed_summary: str = ""
