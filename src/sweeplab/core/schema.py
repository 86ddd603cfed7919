"""The run record: the tag, param and metric names sweeplab's runs carry (docs/metrics.md), in one place.

Writers (the job, its timer, the sweep) and readers (the study's record, the report, the MLflow views) import these
names; a run-record key is spelled as a string literal nowhere else in src/ (tests/test_schema.py).
"""

from __future__ import annotations

# --- what every job run says about itself (tags) --------------------------------------------------------------------
RUN_NAME_TAG = "mlflow.runName"
FAMILY_TAG = "family"
BACKEND_TAG = "backend"
DEVICE_TAG = "device"
PRECISION_TAG = "precision"
COMPILE_TAG = "compile"
ERROR_TAG = "error"                # why a run FAILED or was KILLED, one line
OUTPUT_DIR_TAG = "output_dir"      # the job's Hydra output directory (its checkpoints/ are under it)
MONITOR_TAG = "monitor"            # the validation metric the job monitors (its best checkpoint's, the verdict's)
MONITOR_MODE_TAG = "monitor_mode"  # "max" | "min"
BATCH_SIZE_USED_TAG = "data.batch_size_used"  # set where a job trained on smaller batches than it asked for

# --- a job's place in a study (tags the sweeplab sweeper's jobs carry) ----------------------------------------------
CONFIG_TAG = "config"              # the configuration's identity: its swept overrides
CONFIG_INDEX_TAG = "config_index"  # the configuration's index in the sweep's grid (0: the default baseline)
REPLICATE_TAG = "replicate"        # which replicate of its configuration (0-based; seed = seed + replicate)
ROUND_TAG = "round"                # the round the job ran in (a round runs each configuration once)
HOST_TAG = "host"
CONCURRENT_JOBS_TAG = "concurrent_jobs"  # jobs of the sweep that ran side by side with this one
GPU_TAG = "gpu"                    # the GPU id(s) a GPU sweep's job claimed (distributed.claim_gpus)
SEED_TAG = "seed"
SWEEP_ID_TAG = "sweep_id"
HYDRA_JOB_TAG = "hydra_job"        # the job's number in Hydra's launch order
OBJECTIVE_TAG = "objective"        # the job's return value's metric name (the sweep callback's record)
OBJECTIVE_MODE_TAG = "objective_mode"
STOP_REASON_TAG = "stop_reason"    # a job stopped early by stop.*: "target" (reached it) | "behind" (right-censored)
STOP_STEP_TAG = "stop_step"        # optimizer steps done when it stopped
SLURM_JOB_ID_TAG = "slurm_job_id"  # the job's SLURM id (`<array job id>_<index>` for an array task: sacct's, scancel's)
SLURM_ARRAY_INDEX_TAG = "slurm_array_index"  # its index in the sweep's job array
SLURM_RESTARTS_TAG = "slurm_restarts"  # times SLURM ran the job again (requeue, preemption, time limit) into this run
SLURM_END_TAG = "slurm_end"        # how SLURM ended a job of this run before it could end itself ("CANCELLED: ...");
                                   # kept when a continued study resumes the run (the job's own reason: `error`)

# --- the sweep's own run (tags, metrics) ----------------------------------------------------------------------------
TARGET_TAG = "report.target"       # what the sweep asked of its verdict
TOLERANCE_TAG = "report.quality_tolerance"
INDIFFERENCE_TAG = "report.indifference"  # the verdict may name the fastest or one within this ratio of it
LOOKS_TAG = "report.looks"  # how many times replicates=auto may read the verdict: its intervals hold at each
SWEEP_DIR_TAG = "sweep_dir"
SWEEP_OVERRIDES_TAG = "sweep_overrides"
JOBS_PLANNED = "jobs_planned"
JOBS_NOT_RUN = "jobs_not_run"
CONTINUE_COMMAND_TAG = "continue_command"  # the command that continues the sweep, its launcher settings included
LEFT_JOBS_TAG = "left_jobs"        # submitted and left running (hydra.sweeper.leave=true): which, and where recorded
LOST_JOBS_TAG = "lost_jobs"        # jobs the scheduler ended before they could end themselves (sweep.lost_jobs)

# --- params (the flattened resolved config) the study reads ---------------------------------------------------------
BATCH_SIZE_PARAM = "data.batch_size"
ACCUMULATE_PARAM = "trainer.accumulate_grad_batches"
DEVICES_PARAM = "trainer.devices"
MAX_STEPS_PARAM = "trainer.max_steps"
SEED_PARAM = "data.seed"

# --- a job's summary metrics (callbacks/timing.py and the task) -----------------------------------------------------
SAMPLES_PER_SEC = "summary/samples_per_sec"
SAMPLES_PER_STEP = "summary/samples_per_step"  # training samples one optimizer step consumed, as the timer counted
TOKENS_PER_SEC = "summary/tokens_per_sec"
MFU = "summary/mfu"
STEP_TIME_MEDIAN = "summary/step_time_s_median"
STEP_TIME_SPREAD = "summary/step_time_spread"
PEAK_MEM_MB = "summary/peak_mem_mb"
OBJECTIVE = "objective"            # the job's return value (metric)

# --- where a job's wall time went (metrics, step 0; sweeplab.core.wall.PARTS names the parts) ---
WALL_BREAKDOWN_METRIC = "summary/wall_breakdown/{part}_s"  # setup, warmup, steps, validation, checkpoints, mlflow,
                                                            # teardown: disjoint, summing to the job's wall time
SETUP_SPLIT_METRIC = "summary/setup_split/{segment}_s"  # the setup part in segments (sweeplab.core.wall.SETUP_SEGMENTS),
                                                        # summing to it; MLflow's writes during the set-up in none

SWEEP_PROCESS_WALL_METRIC = "sweep/process_wall_s"  # the sweep's parent run: its process's start to its report
SWEEP_PROCESS_START_METRIC = "sweep/process_start_s"  # ... and when that process started (Unix seconds): a continued
                                                      # sweep's report sets its wall against the jobs it ran
SWEEP_UNCACHED_BYTECODE_TAG = "sweep/uncached_bytecode"  # the parent run, when its Python compiled these packages'
                                                         # sources at the start (sweeplab.core.bytecode)

# --- what a compiled job's compilation found in torch inductor's caches (metrics; compile != off) ---
COMPILE_CACHE_METRIC = "summary/compile_cache/{counter}"  # fxgraph_cache_hit/_miss, autograd_cache_hit/_miss
