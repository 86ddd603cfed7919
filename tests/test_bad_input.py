"""Each bad input: one clear line naming the input, a non-zero exit, no traceback, no MLflow run left RUNNING.

The CLI runs in-process (as `python -m sweeplab.train` would) to keep the suite fast; a few cases also run in a
real subprocess elsewhere (test_train_smoke, test_resume).
"""

from __future__ import annotations

import json
import sys

import pytest
from mlflow.tracking import MlflowClient

from sweeplab import train as train_cli


def run_cli(args: list[str], monkeypatch, capsys) -> tuple[int, str]:
    monkeypatch.setattr(sys, "argv", ["sweeplab.train", *args])
    code = 0
    try:
        train_cli.run()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out = capsys.readouterr()
    return code, out.err


def error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("error:")]


def assert_no_running_runs(uri: str) -> None:
    client = MlflowClient(uri)
    for experiment in client.search_experiments():
        for run in client.search_runs([experiment.experiment_id]):
            assert run.info.status != "RUNNING", run.data.tags.get("mlflow.runName")


def assert_failed_cleanly(code: int, err: str, uri: str, *expected: str) -> None:
    """Exit 2, exactly one `error:` line holding each expected text, no traceback, no MLflow run left RUNNING."""
    assert code == 2
    assert all(text in err for text in expected), err
    assert "Traceback" not in err and len(error_lines(err)) == 1
    assert_no_running_runs(uri)


def _jsonl(path, records):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records), encoding="utf-8")
    return path


def bad_files(tmp):
    good = {"input_ids": [5, 6, 7], "attention_mask": [1, 1, 1], "target": [0.1, 0.2]}
    (tmp / "empty.jsonl").write_text("")
    (tmp / "latin1.jsonl").write_bytes(b'{"text": "caf\xe9", "target": [0.1]}\n')
    return {
        "missing": (tmp / "nope.jsonl", "nope.jsonl"),
        "empty": (tmp / "empty.jsonl", "empty"),
        "non_utf8": (tmp / "latin1.jsonl", "UTF-8"),
        "malformed": (_jsonl(tmp / "broken.jsonl", [good, '{"input_ids": [1,'] ), "broken.jsonl:line 2"),
        "dim_mismatch": (_jsonl(tmp / "dims.jsonl", [good, {**good, "target": [0.1, 0.2, 0.3]}]), "dims.jsonl:line 2"),
        "nan_target": (_jsonl(tmp / "nan.jsonl", [good, '{"input_ids": [1], "attention_mask": [1], "target": [NaN, 0.0]}']), "nan.jsonl:line 2"),
    }


@pytest.mark.parametrize("case", ["missing", "empty", "non_utf8", "malformed", "dim_mismatch", "nan_target"])
def test_bad_data_files(case, tmp_path, mlflow_uri, monkeypatch, capsys):
    path, expected = bad_files(tmp_path)[case]
    code, err = run_cli(["debug=smoke", f"data.path={path}"], monkeypatch, capsys)
    assert_failed_cleanly(code, err, mlflow_uri, expected, str(path.name))


@pytest.mark.parametrize(
    "args,expected",
    [
        (["data.batch_size=0"], "data.batch_size must be > 0"),
        (["data.batch_size=eight"], "data.batch_size: expected int, got 'eight'"),
        (["trainer.max_steps=-5"], "max_steps must be > 0"),
        (["optim.lr=0"], "lr must be > 0"),
        (["loss.alpha=-0.5"], "alpha and beta must be >= 0"),
        (["loss.alpha=0", "loss.beta=0"], "alpha and beta are both 0"),
        (["model=pagating_lm", "model.alpha=1.5"], "alpha=1.5"),
        (["backend=mps"], "backend=mps: MPS is not available"),
        (["backend=cuda"], "backend=cuda: no CUDA device"),
        (["trainer.precision=16-mixed"], "16-mixed needs a GPU"),
    ],
)
def test_bad_values(args, expected, mlflow_uri, monkeypatch, capsys):
    code, err = run_cli(["debug=smoke", *args], monkeypatch, capsys)
    assert_failed_cleanly(code, err, mlflow_uri, expected)


@pytest.mark.parametrize(
    "args,expected",
    [
        (["model.freze=trunk"], "error: config error: model.freze: unknown key; did you mean model.freeze?"),
        (["model=textbrige"], "Could not find 'model/textbrige'; available: pagating_lm, textbridge"),
        (["backend=tpu"], "Could not find 'backend/tpu'"),
    ],
)
def test_misspelt_keys_and_groups_fail_in_hydra_composition(args, expected, mlflow_uri, monkeypatch, capsys):
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)  # what users see: no stack trace, and no 4-line Hydra note
    code, err = run_cli(args, monkeypatch, capsys)
    assert_failed_cleanly(code, err, mlflow_uri, expected)
    assert err.strip().count("\n") == 0, err


def test_data_decided_mistakes(demo_dir, mlflow_uri, monkeypatch, capsys):
    base = ["debug=smoke", f"data.path={demo_dir}"]
    code, err = run_cli([*base, "model.out_dim=32"], monkeypatch, capsys)
    assert code == 2 and "model.out_dim: is 32 but the targets" in err and "64 dimensions" in err
    code, err = run_cli([*base, "model.out_dim=64", "model.vocab_size=10"], monkeypatch, capsys)
    assert code == 2 and "token id" in err and "demo.tokens.jsonl:line" in err and "model.vocab_size" in err
    code, err = run_cli([*base, "model.out_dim=64", "model.max_len=4", "data.too_long=error"], monkeypatch, capsys)
    assert code == 2 and "max_len" in err
    assert_no_running_runs(mlflow_uri)


def test_unreachable_tracking_server_fails_fast_naming_the_uri(monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9")
    code, err = run_cli(["debug=smoke"], monkeypatch, capsys)
    assert code == 2 and "http://127.0.0.1:9" in err and "Traceback" not in err
