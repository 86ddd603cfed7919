"""Options that would select nothing or conflict are refused in one line, not ignored (issue 27): the export's
options that apply only with another, the report's flags that contradict each other or match no run."""

from __future__ import annotations

import subprocess
import sys

import pytest

from sweeplab.core.errors import ConfigError
from sweeplab.export.__main__ import check_conflicts
from sweeplab.export.options import options_from_config
from sweeplab.report import __main__ as report


@pytest.mark.parametrize("given, export, container, key", [
    ({"export.nbits"}, {"nbits": 4}, {}, "export.nbits"),
    ({"export.palettize_mode"}, {"palettize_mode": "kmeans"}, {}, "export.palettize_mode"),
    ({"export.weight_threshold"}, {"weight_threshold": 100}, {}, "export.weight_threshold"),
    ({"export.n_real"}, {"n_real": 2}, {}, "export.n_real"),
    ({"export.tolerance"}, {"verify": False}, {}, "export.tolerance"),
    ({"tracking_uri"}, {}, {"ckpt_path": "x.ckpt"}, "tracking_uri"),
])
def test_an_export_option_that_would_do_nothing_is_refused_naming_it(given, export, container, key):
    with pytest.raises(ConfigError, match=rf"{key}: applies only with"):
        check_conflicts(given, options_from_config(export), container)


def test_the_same_options_with_what_they_need_are_accepted():
    check_conflicts({"export.nbits", "export.palettize_mode"},
                    options_from_config({"compression": "palettize", "nbits": 4}), {})
    check_conflicts({"tracking_uri"}, options_from_config({}), {"run_id": "abc"})


def test_the_export_app_refuses_in_one_line_before_reading_anything(tmp_path):
    done = subprocess.run([sys.executable, "-m", "sweeplab.export", f"ckpt_path={tmp_path / 'none.ckpt'}",
                           "export.nbits=4"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-2000:]
    (line,) = [li for li in done.stderr.splitlines() if li.strip()]
    assert line.startswith("error: ") and "export.nbits: applies only with export.compression=palettize" in line


@pytest.mark.parametrize("argv, text", [
    (["--sweep", "abc", "--experiment-name", "x"], "--experiment-name picks the latest sweep; it does nothing with --sweep"),
    (["--target", "nan"], "--target must be a finite number"),
    (["--quality-tolerance", "-0.1"], "--quality-tolerance must be >= 0"),
])
def test_report_flags_that_contradict_each_other_are_refused_in_one_line(argv, text, capsys, tmp_path):
    assert report.main([*argv, "--tracking-uri", f"sqlite:///{tmp_path / 'none.db'}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and text in err[0], err
    assert not (tmp_path / "none.db").exists()  # refused before the store is opened
