"""The study's caveats, gathered in one place (sweeplab.study.caveats) and shown above the verdict (issue 52)."""

from __future__ import annotations

from sweeplab.report import html
from sweeplab.study import caveats
from sweeplab.study.sweep import JobRecord


def job(number: int, load: float, stop_reason: str | None = None) -> JobRecord:
    metrics = {"summary/batch_shapes": 1.0, "summary/host_cpus": 2.0, "summary/load_avg_start": load,
               "summary/load_avg_end": load}
    return JobRecord(f"run{number}", f"job{number}", "FINISHED", 0, {}, {}, metrics, "textbridge", "c", 0, number, number,
                     None, 1, "32", 32, 100.0, stop_reason=stop_reason)


def test_a_loaded_host_and_jobs_stopped_by_rule_are_caveats_with_their_counts():
    found = caveats.study_caveats([job(0, 16.0), job(1, 25.0, "behind"), job(2, 0.5)], None)
    assert [c.short for c in found] == ["loaded host (2/3)", "1/3 stopped by rule"]
    assert found[0].line.startswith("caveat: 2 of 3 jobs ran on a loaded host (load 16.0-25.0 on 2 CPUs)")
    assert "stop.behind: 1" in found[1].line
    assert caveats.study_caveats([job(0, 0.5)], None) == ()


def test_report_html_shows_the_caveats_first_and_the_verdict_as_its_headline():
    section = html.verdict_section(["caveat: every job ran on a loaded host", "tie for fastest: a, b", "  a: 1.0"])
    assert section.index('class="caveat"') < section.index('class="head">tie for fastest')
