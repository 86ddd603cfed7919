"""The sweep's answer from replicated jobs: per-configuration figures with intervals, and a verdict.

Which configuration reaches the target quality fastest, by how much, and which ones the noise cannot separate.
Pure: plain dataclasses and numpy, no engine. The sweeper, the MLflow wiring and the report build `Job` records from
their runs and call `summarize`; `plan_replicates` tells `replicates=auto` where more replicates would decide
something. By concern, bottom to top (docs/verdict.md has the reasoning and the measured error rates and power):

- records: the jobs in; the estimates, summaries and verdict out; FIGURES, the table of per-configuration figures
  every reader iterates.
- intervals: Student-t intervals of means and medians, paired ratios and differences.
- target: when a job first reached the target; the default target (the worst best metric, less the tolerance).
- pairing: a configuration's jobs against the baseline's by round (or host).
- text: cells, intervals and ratios as a person reads them.
- decision: the verdict read from the pairwise selection (sweeplab.study.selection); planning: replicates=auto.
- summary: `summarize`, which puts them together.
"""

from __future__ import annotations

from sweeplab.study.verdict.decision import (
    FEWEST_REPLICATES,
    ONE_REPLICATE,
    cannot_carry_a_verdict,
    decide,
    pareto_front,
    speed_quality_front,
)
from sweeplab.study.verdict.intervals import (
    difference_from_pairs,
    mean_interval,
    median_of_positive,
    median_of_values,
    ratio_from_log_ratios,
    simultaneous_level,
)
from sweeplab.study.verdict.pairing import paired_values
from sweeplab.study.verdict.planning import ReplicatePlan, plan_replicates
from sweeplab.study.verdict.records import (
    CONFIDENCE,
    FIGURES,
    ConfigSummary,
    Estimate,
    Figure,
    Interval,
    Job,
    JobAtTarget,
    Mode,
    PairBy,
    Quality,
    SweepSummary,
    ValidationPoint,
    Verdict,
    VerdictKind,
    measured_per_job,
    shown_in_the_view,
)
from sweeplab.study.verdict.summary import COARSE_VALIDATION, derived_tolerance, overfitting, summarize
from sweeplab.study.verdict.target import default_target, job_at_target, reaches
from sweeplab.study.verdict.text import (
    SANE_SPAN,
    estimate_text,
    format_ratio,
    interval_text,
    not_measured,
    render_table,
    table_cells,
    table_header,
)

__all__ = [
    "COARSE_VALIDATION",
    "CONFIDENCE",
    "ConfigSummary",
    "Estimate",
    "FEWEST_REPLICATES",
    "FIGURES",
    "measured_per_job",
    "Figure",
    "Interval",
    "Job",
    "JobAtTarget",
    "Mode",
    "ONE_REPLICATE",
    "PairBy",
    "Quality",
    "ReplicatePlan",
    "SANE_SPAN",
    "SweepSummary",
    "ValidationPoint",
    "Verdict",
    "VerdictKind",
    "cannot_carry_a_verdict",
    "decide",
    "default_target",
    "derived_tolerance",
    "difference_from_pairs",
    "estimate_text",
    "format_ratio",
    "interval_text",
    "job_at_target",
    "mean_interval",
    "median_of_positive",
    "median_of_values",
    "not_measured",
    "overfitting",
    "paired_values",
    "pareto_front",
    "plan_replicates",
    "ratio_from_log_ratios",
    "reaches",
    "render_table",
    "shown_in_the_view",
    "simultaneous_level",
    "speed_quality_front",
    "summarize",
    "table_cells",
    "table_header",
]
