"""Any sweep opened by name: `make ui ARGS="--sweep ID|FOLDER|SWEEP_ID"` and `make report ARGS="--sweep ..."` go
through mlflow_store.sweep_named; without it, "latest" is the latest finished sweep (a later one that failed or
still runs is not), and the printed line names the sweep it opens."""

from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient

from sweeplab.core.channels import PARENT_RUN_FILE
from sweeplab.core.errors import UserError
from sweeplab.tracking import mlflow_store


def make_sweep(uri: str, tmp_path, sweep_id: str, status: str) -> str:
    """A sweep run (no jobs) with its folder, as the sweep callback records one; its id."""
    experiment = mlflow_store.init_store(uri, "studies")
    folder = tmp_path / "multirun" / sweep_id
    folder.mkdir(parents=True)
    run = MlflowClient(uri).create_run(experiment, run_name=f"sweep {sweep_id}", tags={
        "sweeplab.role": "sweep", "sweep_id": sweep_id, "sweep_dir": str(folder)}).info.run_id
    (folder / PARENT_RUN_FILE).write_text(run)
    if status != "RUNNING":
        MlflowClient(uri).set_terminated(run, status)
    return run


@pytest.fixture
def make_ui(monkeypatch, capsys):
    """`python -m sweeplab.ui --no-serve ARGS`: (exit status, stdout, stderr)."""
    from sweeplab import ui

    monkeypatch.delenv(mlflow_store.UI_URL_ENV, raising=False)

    def run(*args: str) -> tuple[int, str, str]:
        status = ui.main(["--no-serve", *args])
        out, err = capsys.readouterr()
        return status, out, err

    return run


def test_latest_is_the_latest_finished_sweep_and_any_other_opens_by_name(mlflow_uri, tmp_path, make_ui):
    older = make_sweep(mlflow_uri, tmp_path, "2026-12-01/10-00-00", "FINISHED")
    failed = make_sweep(mlflow_uri, tmp_path, "2026-12-02/10-00-00", "FAILED")
    running = make_sweep(mlflow_uri, tmp_path, "2026-12-03/10-00-00", "RUNNING")
    assert mlflow_store.latest_sweep(mlflow_uri) == older
    for name in (failed, str(tmp_path / "multirun" / "2026-12-02/10-00-00"), "2026-12-02/10-00-00"):
        assert mlflow_store.sweep_named(mlflow_uri, name) == failed
    assert mlflow_store.sweep_named(mlflow_uri, running) == running
    with pytest.raises(UserError, match="not found or empty"):
        mlflow_store.sweep_named(mlflow_uri, str(tmp_path))  # a folder that is no sweep's
    status, out, err = make_ui()
    assert status == 0, err
    assert out.startswith(f"the latest finished sweep 2026-12-01/10-00-00 (run {older}): http://127.0.0.1:5000/")
    status, out, err = make_ui("--sweep", "multirun/2026-12-02/10-00-00")  # relative to the working directory
    assert status == 0, err
    assert out.startswith(f"sweep 2026-12-02/10-00-00 (run {failed}): http://127.0.0.1:5000/#/experiments/")


def test_a_sweep_named_that_the_store_lacks_is_one_line(mlflow_uri, make_ui):
    job = MlflowClient(mlflow_uri).create_run(mlflow_store.init_store(mlflow_uri, "studies")).info.run_id
    for name, says in (("0123456789abcdef", "--sweep=0123456789abcdef: not found"),
                       (job, "is not a sweep's run")):
        status, out, err = make_ui("--sweep", name)
        errors = err.strip().splitlines()
        assert status == 2 and not out and len(errors) == 1 and errors[0].startswith("error: ")
        assert says in errors[0]
