"""The run record: every tag, param and metric name a sweeplab run carries, in one place (docs/metrics.md).

Writers (the job, the timer, the sweep) and readers (the study's record, the report, the MLflow views) both import
these names; no other module spells a run-record key as a string literal.
"""

from __future__ import annotations

# --- a job's place in a study (tags) ---
CONFIG_TAG = "config"              # the configuration's identity: its swept overrides, sorted
CONFIG_INDEX_TAG = "config_index"  # the configuration's index in the sweep's plan (0 = the first, the default baseline)
REPLICATE_TAG = "replicate"        # which replicate of its configuration (0-based; seed = data.seed + replicate)
ROUND_TAG = "round"                # the round the job ran in (a round runs each configuration once)

# --- what the job trained on (tags) ---
BATCH_SIZE_USED_TAG = "data.batch_size_used"  # set where a job trained on smaller batches than it asked for

# --- what the sweep asked of its verdict (tags of the sweep's parent run) ---
TARGET_TAG = "report.target"
TOLERANCE_TAG = "report.quality_tolerance"

# --- where a job's wall time went (metrics, step 0; sweeplab.core.wall.PARTS names the parts) ---
WALL_BREAKDOWN_METRIC = "summary/wall_breakdown/{part}_s"  # setup, warmup, steps, validation, checkpoints, mlflow,
                                                            # teardown: disjoint, summing to the job's wall time

# --- what a compiled job's compilation found in torch inductor's caches (metrics; compile != off) ---
COMPILE_CACHE_METRIC = "summary/compile_cache/{counter}"  # fxgraph_cache_hit/_miss, autograd_cache_hit/_miss
