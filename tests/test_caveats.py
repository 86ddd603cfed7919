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


def packed_job(number: int, config: str, packed_s: float, solo_s: float, lanes: int = 4) -> JobRecord:
    """A job of mlp_regressor's family run `lanes` to a GPU: its step time packed, its configuration's alone."""
    tags = {"lanes_per_gpu": str(lanes), "solo_step_time_s": str(solo_s)}
    return JobRecord(f"run{number}", f"job{number}", "FINISHED", 0, {}, tags, {"summary/step_time_s_median": packed_s},
                     "mlp_regressor", config, 0, number, number, None, lanes, "32", 32, 100.0)


def test_packing_that_slowed_one_configuration_more_is_a_caveat_with_the_advice():
    """Configuration b's packed speed is made to change (2x its step time alone) while a's stays (1.05x): the
    ratio between them is partly the packing's."""
    jobs = [packed_job(i, "a", 0.0105 + 0.0001 * i, 0.010) for i in range(3)]
    jobs += [packed_job(3 + i, "b", 0.0200 + 0.0001 * i, 0.010) for i in range(3)]
    (found,) = caveats.study_caveats(jobs, None)
    assert "lanes_per_gpu=1" in found.line and "b ran 2.01x" in found.line
    assert found.short.startswith("packing moved speeds")
    assert caveats.packing_line(jobs).startswith("packing check (4 jobs side by side on each GPU)")


def test_packing_that_slowed_every_configuration_alike_or_within_the_noise_is_no_caveat():
    alike = [packed_job(i, c, 0.018 + 0.0001 * i, 0.010) for i, c in enumerate("ababab")]
    assert caveats.study_caveats(alike, None) == ()
    assert "a 1.82x, b 1.83x" in caveats.packing_line(alike)
    overlapping = [packed_job(0, "a", 0.010, 0.010), packed_job(1, "a", 0.030, 0.010),
                   packed_job(2, "b", 0.013, 0.010), packed_job(3, "b", 0.020, 0.010)]
    assert caveats.study_caveats(overlapping, None) == ()  # the replicates' slowdowns overlap: noise, not packing
    alone = [packed_job(i, c, 0.030, 0.010, lanes=1) for i, c in enumerate("ab")]
    assert caveats.study_caveats(alone, None) == () and caveats.packing_line(alone) is None
