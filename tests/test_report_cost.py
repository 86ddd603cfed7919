"""Where the jobs' time went (sweeplab.report.cost): the wall-breakdown sums of a study's jobs in report.md and
report.html, from what the jobs recorded."""

from __future__ import annotations

from sweeplab.core.records import JOB, key_of
from sweeplab.report import cost
from sweeplab.report import html as report_html
from sweeplab.study.sweep import JobRecord


def _job(index: int, parts: dict[str, float], segments: dict[str, float] | None = None) -> JobRecord:
    metrics = {key_of(JOB.wall_breakdown, p): s for p, s in parts.items()}
    metrics |= {key_of(JOB.setup_split, k): s for k, s in (segments or {}).items()}
    return JobRecord(f"r{index}", f"job {index}", "FINISHED", 0, {}, {}, metrics, "x", None, None, None, None,
                     None, 1, "8", 8, 1.0)


PARTS = {"setup": 0.5, "warmup": 0.2, "steps": 2.0, "validation": 0.25, "checkpoints": 0.05, "mlflow": 0.1,
         "teardown": 0.0}


def test_the_parts_are_summed_over_the_jobs_with_their_share_and_largest_job():
    first = _job(0, {**PARTS, "setup": 20.5}, {"process_start": 18.0, "data": 2.0, "fit_start": 0.5})
    later = [_job(i, PARTS, {"process_start": 0.0, "fit_start": 0.5}) for i in (1, 2, 3)]
    table = cost.cost_table([first, *later, _job(9, {})])  # a job that recorded no breakdown is left out
    rows = {row["part"]: row for row in table.rows}
    assert list(rows) == [cost.PART_NAMES[p] for p in PARTS]
    whole = 20.5 + 3 * 0.5 + 4 * (0.2 + 2.0 + 0.25 + 0.05 + 0.1)
    assert rows["set-up"]["s (all jobs)"] == "22.0" and rows["set-up"]["s (largest job)"] == "20.5"
    assert rows["training steps"]["s (all jobs)"] == "8.0"
    assert rows["training steps"]["share"] == f"{100 * 8.0 / whole:.0f} %"
    assert table.above == (f"4 jobs, {whole:.1f} s of job time in all, 8.0 s of it in training steps "
                           f"({100 * 8.0 / whole:.0f} %)",)
    # the set-up's largest segments, largest first
    assert table.below[-1] == "set-up's largest segments (summary/setup_split/*): process_start 18.0 s, data 2.0 s, fit_start 2.0 s"


def test_the_sweeps_process_wall_time_sets_the_steps_against_the_whole_study():
    table = cost.cost_table([_job(0, PARTS), _job(1, PARTS)], process_wall_s=16.0)
    assert table.above[-1] == ("the sweep's process: 16.0 s from its start to this report; the jobs' training steps "
                               "are 25 % of it")
    assert len(cost.cost_table([_job(0, PARTS)]).above) == 1  # no process wall recorded: no such line


def test_a_sweep_whose_jobs_recorded_no_breakdown_gets_no_table():
    assert cost.cost_table([_job(0, {}), _job(1, {})]) is None
    assert cost.cost_table([]) is None


def test_the_page_folds_the_table_after_the_jobs():
    table = cost.cost_table([_job(0, PARTS)])
    configurations = report_html.Table(("run",), [{"run": "job 0"}], "run")
    page = report_html.page("sweep", ("a verdict",), configurations, time_spent=table)
    assert "<summary>where the jobs' time went</summary>" in page and 'id="time"' in page
    assert page.index("where the jobs' time went") > page.index('id="configurations"')
    assert "where the jobs" not in report_html.page("sweep", ("a verdict",), configurations)


def test_a_start_that_compiled_the_libraries_sources_is_named_under_the_table():
    table = cost.cost_table([_job(0, PARTS)], uncached_bytecode="torch, lightning")
    assert table.below[-1].startswith("this Python compiled torch, lightning's sources at its start")
    assert "compileall" in table.below[-1]
    assert not any("compiled" in line for line in cost.cost_table([_job(0, PARTS)]).below)
