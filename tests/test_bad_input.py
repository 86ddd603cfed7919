"""Each bad input: one clear line naming the input, a non-zero exit, no traceback, no MLflow run left RUNNING.

The CLI runs in-process (as `python -m sweeplab.train` would) to keep the suite fast; a few cases also run in a
real subprocess elsewhere (test_train_smoke, test_resume).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from conftest import smoke_config
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


def assert_no_runs_at_all(uri: str) -> None:
    client = MlflowClient(uri)
    assert [r.info.run_name for e in client.search_experiments() for r in client.search_runs([e.experiment_id])] == []


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
    if case == "missing":  # a check that needs no run happens before one exists
        assert_no_runs_at_all(mlflow_uri)


@pytest.mark.parametrize(
    "args,expected",
    [
        (["data.batch_size=0"], "data.batch_size: must be >= 1, got 0"),
        (["data.batch_size=eight"], "data.batch_size: expected int, got 'eight'"),
        (["trainer.max_steps=-5"], "trainer.max_steps: must be >= 1, got -5"),
        (["optim.lr=0"], "lr must be > 0"),
        (["loss.alpha=-0.5"], "loss.alpha: must be >= 0, got -0.5"),
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


# --- values no check used to reject (issue 13, cause 5): refused by `training.plan`, before any run exists ---------
@pytest.mark.parametrize(
    "args,expected",
    [
        (["optim.grad_clip=-1"], "optim.grad_clip: must be >= 0, got -1"),
        (["optim.decay_steps=-5"], "optim.decay_steps: must be >= 1, got -5"),
        (["optim.eps=-1e-8"], "optim.eps: must be > 0"),
        (["optim.betas=[0.9,1.0]"], "optim.betas: item 1 must be in [0, 1), got 1.0"),
        (["optim.betas=[0.9]"], "optim.betas: needs 2 values"),
        (["loss.alpha=nan"], "loss.alpha: expected a finite number, got nan"),
        (["optim.lr=inf"], "optim.lr: expected a finite number, got inf"),
        (["data.num_workers=-1"], "data.num_workers: must be >= 0, got -1"),
        (["timing.window=0"], "timing.window: must be >= 1, got 0"),
        (["backend.cpu_threads=0"], "backend.cpu_threads: must be >= 1"),
        (["trainer.limit_val_batches=1.5"], "trainer.limit_val_batches: must be in [0, 1], got 1.5"),
        (["model.dilations=[1,0]"], "model.dilations: item 1 must be >= 1, got 0"),
        (["seed=-1"], "seed: expected an integer in [0, 4294967295], got -1"),
        (["model=pagating_lm", "data.num_workers=-2"], "data.num_workers: must be >= 0"),
    ],
)
def test_out_of_range_values_fail_before_any_run(args, expected, mlflow_uri, monkeypatch, capsys):
    code, err = run_cli(["debug=smoke", *args], monkeypatch, capsys)
    assert_failed_cleanly(code, err, mlflow_uri, f"config error: {expected}")
    assert not MlflowClient(mlflow_uri).search_runs(["0"]) and len(MlflowClient(mlflow_uri).search_experiments()) == 1


def test_a_negative_grad_clip_fails_in_a_real_process_before_any_run(tmp_path, mlflow_uri):
    code, err = run_cli_subprocess(["debug=smoke", "optim.grad_clip=-1"], tmp_path, mlflow_uri)
    assert_failed_cleanly(code, err, mlflow_uri, "config error: optim.grad_clip: must be >= 0, got -1")
    assert MlflowClient(mlflow_uri).get_experiment_by_name("sweeplab") is None  # no run, not even its experiment


def test_warmup_longer_than_the_run_warns_naming_the_peak_lr(demo_dir, caplog):
    from sweeplab.engine.plan import plan

    with caplog.at_level("WARNING", logger="sweeplab.engine.training"):
        plan(smoke_config(demo_dir, "optim.warmup_steps=40", "trainer.max_steps=20", "optim.lr=1e-3"))
    assert "optim.warmup_steps=40 is longer than the run (trainer.max_steps=20)" in caplog.text
    assert "peaks at 0.0005" in caplog.text


# --- data that trains on nothing or grows the model (issue 13, cause 6) --------------------------------------------
def run_cli_subprocess(args: list[str], cwd, uri: str) -> tuple[int, str]:
    """`python -m sweeplab.train` as a user runs it: a real process, its own interpreter and exit status."""
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri}
    env.pop("HYDRA_FULL_ERROR", None)
    result = subprocess.run(
        [sys.executable, "-m", "sweeplab.train", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )
    return result.returncode, result.stderr


def _token_records(n: int, **fields) -> list[dict]:
    return [{"input_ids": [5, 6, 7], "attention_mask": [1, 1, 1], "target": [0.1, 0.2], **fields} for _ in range(n)]


def test_all_masks_zero_is_refused_naming_the_file_in_a_real_process(tmp_path, mlflow_uri):
    path = _jsonl(tmp_path / "masked.jsonl", _token_records(20, attention_mask=[0, 0, 0]))
    code, err = run_cli_subprocess(["debug=smoke", f"data.path={path}", "model.out_dim=2"], tmp_path, mlflow_uri)
    assert_failed_cleanly(code, err, mlflow_uri, "masked.jsonl: attention_mask is 0 everywhere in all 20 records")


def test_all_texts_empty_is_refused(demo_dir, tmp_path, mlflow_uri, monkeypatch, capsys):
    shutil.copy(demo_dir / "tokenizer.json", tmp_path / "tokenizer.json")
    path = _jsonl(tmp_path / "empty_texts.jsonl", [{"text": "", "target": [0.1, 0.2]}] * 20)
    code, err = run_cli(["debug=smoke", f"data.path={path}", "model.out_dim=2"], monkeypatch, capsys)
    assert_failed_cleanly(code, err, mlflow_uri, "empty_texts.jsonl: every text is empty", "nothing to train on")


def test_a_huge_token_id_without_a_tokenizer_is_refused_naming_the_record(tmp_path, mlflow_uri, monkeypatch, capsys):
    records = _token_records(20)
    records[13]["input_ids"] = [5, 3_000_000, 7]
    path = _jsonl(tmp_path / "big_id.jsonl", records)
    code, err = run_cli(["debug=smoke", f"data.path={path}", "model.out_dim=2"], monkeypatch, capsys)
    assert_failed_cleanly(code, err, mlflow_uri, "big_id.jsonl:line 14: token id 3000000", "set model.vocab_size")


@pytest.mark.parametrize("vocab", [None, 1000])
def test_an_efb1_id_near_2_pow_32_is_refused_before_any_allocation(vocab, tmp_path, mlflow_uri, monkeypatch, capsys):
    from sweeplab.families.textbridge.formats import Sample, write_efb1

    samples = [Sample(np.array([0.1, 0.2], np.float32), input_ids=np.array([5, 6]), attention_mask=np.ones(2)) for _ in range(20)]
    samples[7] = Sample(np.array([0.1, 0.2], np.float32), input_ids=np.array([4_000_000_000]), attention_mask=np.ones(1))
    write_efb1(tmp_path / "big.efb1", samples)
    extra = [] if vocab is None else [f"model.vocab_size={vocab}"]
    code, err = run_cli(["debug=smoke", f"data.path={tmp_path / 'big.efb1'}", "model.out_dim=2", *extra], monkeypatch, capsys)
    assert_failed_cleanly(code, err, mlflow_uri, "big.efb1:record 7: token id 4000000000")


def test_ids_beyond_the_tokenizers_vocabulary_are_refused(demo_dir, tmp_path, mlflow_uri, monkeypatch, capsys):
    shutil.copy(demo_dir / "tokenizer.json", tmp_path / "tokenizer.json")  # 500 tokens
    records = _token_records(20)
    records[4]["input_ids"] = [5, 900, 7]
    path = _jsonl(tmp_path / "ids.jsonl", records)
    code, err = run_cli(["debug=smoke", f"data.path={path}", "model.out_dim=2"], monkeypatch, capsys)
    assert_failed_cleanly(code, err, mlflow_uri, "ids.jsonl:line 5: token id 900 >= model vocab_size")


@pytest.mark.parametrize(
    "files,expected",
    [
        ({"tokens_jsonl": "../outside.jsonl"}, "files.tokens_jsonl='../outside.jsonl' is not a file inside"),
        ({"tokens_jsonl": "ABSOLUTE"}, "is not a file inside"),
        (["outside.jsonl"], "not a prepare.py manifest"),
        ({"tokens_jsonl": 5}, "not a prepare.py manifest"),
    ],
)
def test_a_manifest_names_only_files_beside_it(files, expected, tmp_path, mlflow_uri, monkeypatch, capsys):
    outside = _jsonl(tmp_path / "outside.jsonl", _token_records(20))
    (tmp_path / "data").mkdir()
    if isinstance(files, dict) and files.get("tokens_jsonl") == "ABSOLUTE":
        files = {"tokens_jsonl": str(outside)}
    (tmp_path / "data" / "manifest.json").write_text(json.dumps({"files": files}))
    code, err = run_cli(["debug=smoke", f"data.path={tmp_path / 'data'}", "model.out_dim=2"], monkeypatch, capsys)
    assert_failed_cleanly(code, err, mlflow_uri, "data/manifest.json:line 1:", expected)


# --- plain exceptions with good messages that used to print a traceback (issue 13, cause 7) -----------------------
def _lm_dir(tmp, case):
    root = tmp / f"lm_{case}"
    root.mkdir()
    text = "the quick brown fox jumps over the lazy dog\n" * 200
    splits = {"train": text, "valid": text, "test": text}
    if case == "train_only":
        splits = {"train": text}
    for split, body in splits.items():
        (root / f"{split}.txt").write_text(body, encoding="utf-8")
    if case == "empty":
        (root / "valid.txt").write_text("")
    elif case == "binary":
        (root / "train.txt").write_bytes(bytes(range(256)) * 64)
    elif case == "latin1":
        (root / "train.txt").write_bytes("caf\xe9 au lait\n".encode("latin-1") * 100)
    elif case == "tiny":
        for split in ("train", "valid", "test"):
            (root / f"{split}.txt").write_text("tiny\n")
    return root


@pytest.mark.parametrize(
    "case,expected",
    [
        ("missing", "no such file or directory"),  # checked before a run exists: sweeplab's line
        ("empty", "valid.txt: empty file"),
        ("train_only", "no valid.txt or wiki.valid.raw"),
        ("binary", "train.txt: not valid UTF-8 at byte 128"),
        ("latin1", "train.txt: not valid UTF-8 at byte 3"),
        ("tiny", "shorter than one block"),
    ],
)
def test_bad_lm_data_directories(case, expected, tmp_path, mlflow_uri, monkeypatch, capsys):
    path = tmp_path / "nowhere" if case == "missing" else _lm_dir(tmp_path, case)
    code, err = run_cli(["model=pagating_lm", "debug=smoke", f"data.path={path}"], monkeypatch, capsys)
    assert_failed_cleanly(code, err, mlflow_uri, expected)
    if case == "missing":
        assert_no_runs_at_all(mlflow_uri)


@pytest.mark.parametrize("content", ["", '{"version": "1.0", "model": '])
def test_a_corrupt_or_empty_tokenizer_json_is_one_line(content, demo_dir, tmp_path, mlflow_uri, monkeypatch, capsys):
    (tmp_path / "bad_tok").mkdir()
    shutil.copy(demo_dir / "demo.text.jsonl", tmp_path / "bad_tok" / "demo.text.jsonl")
    (tmp_path / "bad_tok" / "tokenizer.json").write_text(content)
    code, err = run_cli(["debug=smoke", f"data.path={tmp_path / 'bad_tok' / 'demo.text.jsonl'}", "model.out_dim=64"], monkeypatch, capsys)
    assert_failed_cleanly(code, err, mlflow_uri, "tokenizer.json: not a valid tokenizer.json")
