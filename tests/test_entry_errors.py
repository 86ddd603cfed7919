"""Every `python -m sweeplab.*` entry point fails like the training app: an unknown config-group option, an unknown
key, an override syntax error and an unwritable output each give one `error:` line naming it, exit status 2, no
traceback. Real `python -m` processes; the unwritable output is a real read-only mount (a private mount namespace).

Apps that take no config group or write nothing (the UI's launcher writes nothing; the report, the UI and the demo
data's preparation parse plain options) get the nearest case: an unknown choice or id, an unknown option, a value
of the wrong type.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from mlflow.tracking import MlflowClient

from test_bad_environment import needs_mounts, run_with_mounts, tmpfs
from test_bad_input import error_lines

RO = "{ro}"  # a read-only tmpfs mounted for the case
# entry point -> case -> (arguments, a text the error line holds)
CASES: dict[str, dict[str, tuple[list[str], str]]] = {
    "sweeplab.train": {
        "group option": (["model=textbrige"], "Could not find 'model/textbrige'; available: pagating_lm, textbridge"),
        "unknown key": (["model.freze=trunk"], "model.freze: unknown key; did you mean model.freeze?"),
        "syntax": (["model.size=tïny"], "override model.size=tïny: unexpected character 'ï' at position 13"),
        "unwritable": (["debug=smoke", f"hydra.run.dir={RO}/run"], "Read-only file system"),
    },
    "sweeplab.profile": {
        "group option": (["model=pagating_llm"], "Could not find 'model/pagating_llm'"),
        "unknown key": (["trainer.max_stepz=3"], "trainer.max_stepz: unknown key; did you mean trainer.max_steps?"),
        "syntax": (["data.path=a\x01b"], r"override data.path=a\x01b: unexpected character '\x01'"),
        "unwritable": (["debug=smoke", "--out", f"{RO}/profile"], "Read-only file system"),
    },
    "sweeplab.order_check": {
        "group option": (["sweep=defalt"], "Could not find 'sweep/defalt'; available: default"),
        "unknown key": (["data.batch_sise=8,16"], "data.batch_sise: unknown key; did you mean data.batch_size?"),
        "syntax": (["data.batch_size=[8,16"], "override data.batch_size=[8,16: no viable alternative"),
        "unwritable": (["data.batch_size=8,16", "--out", f"{RO}/check"], "Read-only file system"),
    },
    "sweeplab.bench": {
        "group option": (["experiment=bench_mpl"], "Could not find 'experiment/bench_mpl'"),
        "unknown key": (["bench.stepz=3"], "bench.stepz: unknown key; did you mean bench.steps?"),
        "syntax": (["model.size=tïny"], "override model.size=tïny"),
        "unwritable": (["--out", f"{RO}/bench"], "Read-only file system"),
    },
    "sweeplab.export": {
        "group option": (["export=nope"], "Could not find 'export/nope'; available: coreai, coreml, none"),
        "unknown key": (["ckpt_path=x.ckpt", "export.precison=fp32"], "export.precison: unknown key; accepted:"),
        "syntax": (["ckpt_path=a", "b"], "override b: not a key=value override"),
        "unwritable": (["ckpt_path=/nonexistent.ckpt", f"out={RO}/pkg"], "Read-only file system"),
    },
    "sweeplab.report": {
        "group option": (["--sweep", "0123456789abcdef"], "0123456789abcdef"),
        "unknown key": (["--bogus"], "unrecognized arguments: --bogus"),
        "syntax": (["--target", "x"], "argument --target: invalid float value: 'x'"),
        "unwritable": (["--experiment", "study", "--out", f"{RO}/report"], "Read-only file system"),
    },
    "sweeplab.ui": {
        "unknown key": (["--bogus"], "unrecognized arguments: --bogus"),
        "syntax": (["--port", "x"], "argument --port: 'x' is not a port number (1 to 65535)"),
    },
    "sweeplab.families.textbridge.prepare": {
        "group option": (["--teacher", "nope"], "argument --teacher: invalid choice: 'nope'"),
        "unknown key": (["--bogus"], "unrecognized arguments: --bogus"),
        "syntax": (["--vocab-size", "x"], "argument --vocab-size: invalid int value: 'x'"),
        "unwritable": (["--out", f"{RO}/demo"], "Read-only file system"),
    },
}
# in the default suite (its time budget): every case of the apps that compose the training config before they import
# torch, one of each other entry point; the rest is marked slow (`make test-all`): the bench imports torch and
# Lightning before it reads its arguments (~10 s a case on a busy 2-core machine), the export torch (~4 s)
# (the training app: its syntax case only, ~6 s each as it imports torch; its other cases are slow)
DEFAULT = {(app, case) for app in ("sweeplab.profile", "sweeplab.order_check") for case in CASES[app]} | {
    ("sweeplab.train", "syntax"),
    ("sweeplab.export", "syntax"),
    ("sweeplab.report", "unknown key"),
    ("sweeplab.ui", "syntax"),
    ("sweeplab.families.textbridge.prepare", "group option"),
}


def _params():
    for app, cases in CASES.items():
        for case in cases:
            marks = [] if (app, case) in DEFAULT else [pytest.mark.slow]
            if case == "unwritable":
                marks.append(needs_mounts)
            yield pytest.param(app, case, marks=marks, id=f"{app.removeprefix('sweeplab.')}-{case.replace(' ', '_')}")


def _store_with_one_job(uri: str) -> None:
    """An experiment `study` holding one finished job run: the report has something to write."""
    client = MlflowClient(uri)
    run = client.create_run(client.create_experiment("study"), run_name="job", tags={"sweeplab.role": "job"})
    client.log_metric(run.info.run_id, "summary/samples_per_sec", 100.0)
    client.set_terminated(run.info.run_id, "FINISHED")


@pytest.mark.parametrize("app, case", list(_params()))
def test_every_entry_point_fails_in_one_line(app, case, tmp_path, mlflow_uri):
    args, expected = CASES[app][case]
    readonly = tmp_path / "readonly"
    args = [a.replace(RO, str(readonly)) for a in args]
    if app == "sweeplab.report":
        _store_with_one_job(mlflow_uri)
    if case == "unwritable":
        code, err = run_with_mounts([tmpfs(readonly, read_only=True)], app, args, tmp_path, mlflow_uri)
    else:
        env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
        done = subprocess.run([sys.executable, "-m", app, *args], capture_output=True, text=True, timeout=120,
                              cwd=tmp_path, env=env)
        code, err = done.returncode, done.stderr
    assert code == 2, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    (line,) = error_lines(err)
    assert expected in line, line
    if case == "unwritable":
        assert str(readonly) in line, line
    else:  # a mistake on the command line: the error line is all there is
        assert err.strip() == line, err[-3000:]
    client = MlflowClient(mlflow_uri)
    assert all(r.info.status != "RUNNING" for e in client.search_experiments() for r in client.search_runs([e.experiment_id]))


@pytest.mark.slow
def test_sweeplab_traceback_shows_the_trace_of_an_expected_error(tmp_path):
    """SWEEPLAB_TRACEBACK=1: the same one-line error, after the traceback (the debug information is not lost)."""
    env = {**{k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}, "SWEEPLAB_TRACEBACK": "1"}
    done = subprocess.run([sys.executable, "-m", "sweeplab.train", "data.batch_size=[8,16"], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path, env=env)
    assert done.returncode == 2
    assert "Traceback" in done.stderr and "OverrideParseException" in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("error: override data.batch_size=[8,16")
