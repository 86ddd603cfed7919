"""The run record's key names under their former constant names, for the modules not yet converted to
sweeplab.core.records (the sweep callback, the study's rounds): every name here is read from the records, none is
spelled here. To be deleted once nothing imports it."""

from __future__ import annotations

from sweeplab.core.records import JOB, SWEEP

# --- a job run's tags --------------------------------------------------------------------------------------------
RUN_NAME_TAG = JOB.name
FAMILY_TAG = JOB.family
BACKEND_TAG = JOB.backend
DEVICE_TAG = JOB.device
PRECISION_TAG = JOB.precision
COMPILE_TAG = JOB.compile
ERROR_TAG = JOB.error
OUTPUT_DIR_TAG = JOB.output_dir
MONITOR_TAG = JOB.monitor
MONITOR_MODE_TAG = JOB.monitor_mode
BATCH_SIZE_USED_TAG = JOB.batch_size_used
CONFIG_TAG = JOB.config
CONFIG_INDEX_TAG = JOB.config_index
REPLICATE_TAG = JOB.replicate
ROUND_TAG = JOB.round
HOST_TAG = JOB.host
CONCURRENT_JOBS_TAG = JOB.concurrent_jobs
GPU_TAG = JOB.gpu
SEED_TAG = JOB.seed
SWEEP_ID_TAG = JOB.sweep_id
HYDRA_JOB_TAG = JOB.hydra_job
OBJECTIVE_TAG = JOB.objective_metric
OBJECTIVE_MODE_TAG = JOB.objective_mode
STOP_REASON_TAG = JOB.stop_reason
STOP_STEP_TAG = JOB.stop_step
SLURM_JOB_ID_TAG = JOB.slurm_job_id
SLURM_ARRAY_INDEX_TAG = JOB.slurm_array_index
SLURM_RESTARTS_TAG = JOB.slurm_restarts
SLURM_END_TAG = JOB.slurm_end

# --- a sweep run's tags ------------------------------------------------------------------------------------------
TARGET_TAG = SWEEP.target
TOLERANCE_TAG = SWEEP.quality_tolerance
INDIFFERENCE_TAG = SWEEP.indifference
LOOKS_TAG = SWEEP.looks
SWEEP_DIR_TAG = SWEEP.sweep_dir
SWEEP_OVERRIDES_TAG = SWEEP.sweep_overrides
JOBS_PLANNED = SWEEP.jobs_planned
JOBS_NOT_RUN = SWEEP.jobs_not_run
CONTINUE_COMMAND_TAG = SWEEP.continue_command
LEFT_JOBS_TAG = SWEEP.left_jobs
LOST_JOBS_TAG = SWEEP.lost_jobs
SWEEP_PROCESS_WALL_METRIC = SWEEP.process_wall_s
SWEEP_PROCESS_START_METRIC = SWEEP.process_start_s
SWEEP_UNCACHED_BYTECODE_TAG = SWEEP.uncached_bytecode

# --- a job run's params and metrics ------------------------------------------------------------------------------
BATCH_SIZE_PARAM = JOB.batch_size
ACCUMULATE_PARAM = JOB.accumulate_grad_batches
DEVICES_PARAM = JOB.devices
MAX_STEPS_PARAM = JOB.max_steps
SEED_PARAM = JOB.data_seed
SAMPLES_PER_SEC = JOB.samples_per_sec
SAMPLES_PER_STEP = JOB.samples_per_step
TOKENS_PER_SEC = JOB.tokens_per_sec
MFU = JOB.mfu
STEP_TIME_MEDIAN = JOB.step_time_median
STEP_TIME_SPREAD = JOB.step_time_spread
PEAK_MEM_MB = JOB.peak_mem_mb
OBJECTIVE = JOB.objective
WALL_BREAKDOWN_METRIC = JOB.wall_breakdown
SETUP_SPLIT_METRIC = JOB.setup_split
COMPILE_CACHE_METRIC = JOB.compile_cache

