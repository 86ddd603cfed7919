"""`make ui-check` (scripts/ui_check.py) checks the sweeplab names it reads before any study or browser: the default
suite fails when one of them is renamed, rather than the browser check failing minutes in (or never running)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "ui_check.py"


def load_ui_check():
    spec = importlib.util.spec_from_file_location("ui_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_sweeplab_name_the_check_reads_exists():
    ui_check = load_ui_check()
    names = ui_check.sweeplab_names(SCRIPT.read_text(encoding="utf-8"))
    # the names it reads through imports, through modules and through records, however deep
    assert "sweeplab.report.saved_view.SECTION_NAME" in names
    assert "sweeplab.core.records.CONFIGURATION.curve" in names
    assert "sweeplab.tracking.mlflow_store.latest_sweep" in names
    ui_check.check_names()  # raises CheckFailed naming any that is gone


def test_a_renamed_name_fails_first_in_one_line(tmp_path):
    """A copy of the script reading a name sweeplab lacks (as after a rename on either side) stops before any store
    or browser, with one `error:` line naming it."""
    source = SCRIPT.read_text(encoding="utf-8")
    assert source.count("saved_view.SECTION_NAME") >= 1
    renamed = tmp_path / "scripts" / "ui_check.py"
    renamed.parent.mkdir()
    renamed.write_text(source.replace("saved_view.SECTION_NAME", "saved_view.SECTION_TITLE"), encoding="utf-8")
    result = subprocess.run([sys.executable, str(renamed), "--chromium", str(tmp_path / "no-chromium")],
                            cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1
    errors = result.stderr.strip().splitlines()
    assert len(errors) == 1 and errors[0].startswith("error: ")
    assert "sweeplab.report.saved_view.SECTION_TITLE" in errors[0]
    assert "recorded study" not in result.stdout and not (tmp_path / "mlflow.db").exists()
