"""Demo dataset preparation (tokenizer, teacher, all three formats, manifest) and the TextBridge DataModule.

Everything runs on a tiny demo: 60 sentences, a ~500-word vocabulary, a 1-layer 32-d random teacher.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from sweeplab.data.corpus import demo_sentences
from sweeplab.data.tokenizer import TextTokenizer
from sweeplab.families.textbridge import prepare as prepare_module
from sweeplab.families.textbridge.data import TextBridgeDataModule, collate_textbridge
from sweeplab.families.textbridge.formats import DataFormatError, Sample, open_dataset, write_efb1, write_jsonl
from sweeplab.families.textbridge.prepare import main, prepare_textbridge_demo, read_manifest
from sweeplab.families.textbridge.teacher import Teacher

TINY = {"teacher": "random", "n_sentences": 60, "vocab_size": 500, "teacher_layers": 1, "teacher_dim": 32, "progress": False}


def snapshot(directory: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in sorted(directory.iterdir())}


@pytest.fixture(scope="module")
def tiny_demo(tmp_path_factory) -> Path:
    return prepare_textbridge_demo(tmp_path_factory.mktemp("prepared") / "demo", **TINY)


# --- tokenizer -----------------------------------------------------------------------------------


def test_tokenizer_trains_saves_and_loads(tmp_path):
    sentences = demo_sentences()[:40]
    tokenizer = TextTokenizer.train(sentences, vocab_size=300)
    assert tokenizer.pad_id == 0 and tokenizer.tokenizer.token_to_id("[UNK]") == 1
    assert 0 < tokenizer.vocab_size <= 300
    again = TextTokenizer.train(sentences, vocab_size=300)
    assert again.tokenizer.to_str() == tokenizer.tokenizer.to_str()  # reproducible (tokenizers#1794 worked around)
    assert again.tokenizer.encode("##e [PAD]", add_special_tokens=False).ids[-1] == 0  # only real specials are special

    ids, masks, n_truncated = tokenizer.encode(["The VALUE of x", "the value of x"], max_len=64)
    assert ids[0] == ids[1]  # lowercased
    assert masks[0] == [1] * len(ids[0]) and n_truncated == 0
    assert tokenizer.tokenizer.token_to_id("[CLS]") not in ids[0]  # no special tokens

    ids, masks, n_truncated = tokenizer.encode(sentences[:5], max_len=3)
    assert all(len(i) <= 3 and len(m) == len(i) for i, m in zip(ids, masks))
    assert n_truncated == sum(len(tokenizer.encode([s], 1000)[0][0]) > 3 for s in sentences[:5])

    saved = tokenizer.save(tmp_path)
    assert saved == tmp_path / "tokenizer.json"
    for path in (saved, tmp_path):
        loaded = TextTokenizer.load(path)
        assert (loaded.vocab_size, loaded.pad_id) == (tokenizer.vocab_size, tokenizer.pad_id)
        assert loaded.encode(sentences, 16) == tokenizer.encode(sentences, 16)


def test_tokenizer_load_errors_are_one_line(tmp_path):
    with pytest.raises(ValueError, match="no such tokenizer"):
        TextTokenizer.load(tmp_path / "absent")
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError) as error:
        TextTokenizer.load(bad)
    assert str(error.value).startswith(f"{bad}: not a valid tokenizer.json") and "\n" not in str(error.value)


# --- preparation ---------------------------------------------------------------------------------


def test_demo_holds_all_three_formats_with_the_same_samples(tiny_demo):
    manifest = read_manifest(tiny_demo)
    assert manifest["num_samples"] == 60 and manifest["target_dim"] == 32
    assert manifest["formats"] == ["tokens_jsonl", "efb1", "text_jsonl"]
    assert manifest["settings"]["vocab_size"] == 500 and manifest["settings"]["teacher"]["dim"] == 32
    assert sorted(p.name for p in tiny_demo.iterdir()) == sorted([*manifest["files"].values(), "manifest.json"])
    assert not [p for p in tiny_demo.parent.iterdir() if ".tmp-" in p.name or ".old-" in p.name]

    tokenizer = TextTokenizer.load(tiny_demo / "tokenizer.json")
    assert manifest["vocab_size"] == tokenizer.vocab_size
    tokens = open_dataset(tiny_demo / manifest["files"]["tokens_jsonl"])
    efb1 = open_dataset(tiny_demo / manifest["files"]["efb1"])
    text = open_dataset(tiny_demo / manifest["files"]["text_jsonl"])
    assert open_dataset(tiny_demo).path == tokens.path  # the directory resolves to token JSONL
    sentences = demo_sentences()[:60]
    expected_ids, _, _ = tokenizer.encode(sentences, 128)
    for i in range(60):
        a, b, c = tokens[i], efb1[i], text[i]
        assert a.text == c.text == sentences[i]
        assert a.input_ids.tolist() == b.input_ids.tolist() == expected_ids[i]
        assert a.target.tobytes() == b.target.tobytes() == c.target.tobytes()
        assert np.isfinite(a.target).all() and np.abs(a.target).sum() > 0


def test_targets_are_the_teachers_mean_pooled_states(tiny_demo):
    tokenizer = TextTokenizer.load(tiny_demo / "tokenizer.json")
    teacher = Teacher.random_distilbert(tokenizer, seed=0, n_layers=1, dim=32)
    sentences = demo_sentences()[:5]
    ids, _, _ = tokenizer.encode(sentences, 128)
    with torch.no_grad():
        hidden = teacher.model(input_ids=torch.tensor([ids[0]])).last_hidden_state
    np.testing.assert_allclose(open_dataset(tiny_demo)[0].target, hidden[0].mean(0).numpy(), rtol=1e-4, atol=1e-5)
    # batching and padding do not change a sample's target
    np.testing.assert_allclose(
        teacher.encode(sentences, batch_size=2, progress=False)[0], hidden[0].mean(0).numpy(), rtol=1e-4, atol=1e-5
    )
    normalized = Teacher.random_distilbert(tokenizer, n_layers=1, dim=32, normalize=True).encode(
        sentences, progress=False
    )
    np.testing.assert_allclose(np.linalg.norm(normalized, axis=1), 1.0, rtol=1e-5)


def test_second_call_with_same_settings_rewrites_nothing(tiny_demo, monkeypatch):
    before = snapshot(tiny_demo)
    monkeypatch.setattr(prepare_module, "_build", lambda *a, **k: pytest.fail("rebuilt an up-to-date dataset"))
    assert prepare_textbridge_demo(tiny_demo, **TINY) == tiny_demo
    assert snapshot(tiny_demo) == before


def test_new_settings_or_force_rebuild_and_the_teacher_is_deterministic(tmp_path):
    out = tmp_path / "demo"
    prepare_textbridge_demo(out, **TINY)
    first = (out / "demo.efb1").read_bytes()
    first_mtimes = snapshot(out)

    prepare_textbridge_demo(out, **TINY, force=True)
    assert snapshot(out) != first_mtimes
    assert (out / "demo.efb1").read_bytes() == first  # same seed, same targets, bit for bit

    prepare_textbridge_demo(out, **{**TINY, "teacher_seed": 1})
    assert read_manifest(out)["settings"]["teacher"]["seed"] == 1
    assert (out / "demo.efb1").read_bytes() != first
    assert sorted(p.name for p in tmp_path.iterdir()) == [".demo.lock", "demo"]  # no temp or old directory left


def test_failure_mid_build_leaves_nothing_behind(tmp_path, monkeypatch):
    def broken_teacher(self, texts, batch_size=64, progress=True):
        raise RuntimeError("teacher crashed")

    monkeypatch.setattr(Teacher, "encode", broken_teacher)
    out = tmp_path / "demo"
    with pytest.raises(RuntimeError, match="teacher crashed"):
        prepare_textbridge_demo(out, **TINY)
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir()] == [".demo.lock"]


def test_failed_rebuild_keeps_the_previous_dataset(tiny_demo, monkeypatch):
    before = snapshot(tiny_demo)
    monkeypatch.setattr(prepare_module, "write_efb1", lambda *a, **k: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(OSError, match="disk full"):
        prepare_textbridge_demo(tiny_demo, **{**TINY, "max_len": 64})
    assert snapshot(tiny_demo) == before and read_manifest(tiny_demo)["settings"]["max_len"] == 128
    assert not [p for p in tiny_demo.parent.iterdir() if ".tmp-" in p.name or ".old-" in p.name]


def test_refuses_to_replace_a_directory_that_is_not_a_dataset(tmp_path):
    (tmp_path / "precious.txt").write_text("user data")
    with pytest.raises(ValueError, match="holds no manifest.json"):
        prepare_textbridge_demo(tmp_path, **TINY)
    assert (tmp_path / "precious.txt").read_text() == "user data"


@pytest.mark.parametrize(
    "bad", [{"vocab_size": 0}, {"n_sentences": -1}, {"teacher_path": "/nonexistent/teacher"}, {"corpus": "wiki"}]
)
def test_bad_options_are_one_line_errors(tmp_path, bad):
    with pytest.raises(ValueError) as error:
        prepare_textbridge_demo(tmp_path / "demo", **{**TINY, **bad})
    assert "\n" not in str(error.value)
    assert not (tmp_path / "demo").exists()


def test_cli_prints_one_line(tiny_demo, capsys, tmp_path):
    args = ["--out", str(tiny_demo), "--n-sentences", "60", "--vocab-size", "500", "--teacher-layers", "1"]
    assert main([*args, "--teacher", "random", "--teacher-dim", "32", "--no-progress"]) == 0
    out = capsys.readouterr().out.strip()
    assert out.startswith(f"up to date, kept {tiny_demo}: 60 samples, target_dim 32") and "\n" not in out

    missing = tmp_path / "no_teacher_here"
    assert main(["--out", str(tmp_path / "demo"), "--teacher-path", str(missing)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: teacher path {missing}: no such directory (expected a local Hugging Face model directory)"


def test_corpus_option_is_recorded_and_another_corpus_rebuilds(tmp_path, capsys):
    out = tmp_path / "demo"
    args = ["--out", str(out), "--n-sentences", "60", "--vocab-size", "500", "--teacher-layers", "1"]
    args += ["--teacher", "random", "--teacher-dim", "32", "--no-progress"]
    assert main([*args, "--corpus", "stdlib"]) == 0
    assert capsys.readouterr().out.startswith(f"wrote {out}: 60 samples")
    manifest = read_manifest(out)
    assert manifest["settings"]["corpus"] == "stdlib"
    assert manifest["corpus"]["name"] == "stdlib" and manifest["corpus"]["docstring_sentences"] > 10000
    assert main([*args, "--corpus", "stdlib"]) == 0
    assert capsys.readouterr().out.startswith(f"up to date, kept {out}")

    # the same 60 sentences (stdlib starts with the reference), but another corpus: rebuilt, and the default is not
    # written into the settings, so directories built before the option existed stay up to date
    assert main(args) == 0
    assert capsys.readouterr().out.startswith(f"wrote {out}")
    manifest = read_manifest(out)
    assert "corpus" not in manifest["settings"] and manifest["corpus"]["name"] == "reference"

    before = snapshot(out)
    with pytest.raises(SystemExit) as exited:  # argparse's mistakes exit from the parser
        main([*args, "--corpus", "wiki"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: argument --corpus: invalid choice: 'wiki' (choose from 'reference', 'stdlib')")
    assert err.count("\n") == 1 and snapshot(out) == before


# --- DataModule ----------------------------------------------------------------------------------


def test_datamodule_uses_a_prepared_demo_dir_and_reports_sizes(tiny_demo):
    before = snapshot(tiny_demo)
    dm = TextBridgeDataModule(path=None, demo_dir=str(tiny_demo), batch_size=8, val_fraction=0.1)
    dm.prepare_data()
    dm.setup("fit")
    assert snapshot(tiny_demo) == before
    assert (dm.num_train, dm.num_val, dm.target_dim) == (54, 6, 32)
    assert dm.source_path == tiny_demo / "demo.tokens.jsonl"
    assert dm.vocab_size == read_manifest(tiny_demo)["vocab_size"]

    batches = list(dm.train_dataloader())
    assert len(batches) == 54 // 8  # drop_last
    batch = batches[0]
    assert batch["input_ids"].dtype == torch.int64 and batch["attention_mask"].dtype == torch.int64
    assert batch["target"].dtype == torch.float32 and batch["target"].shape == (8, 32)
    lengths = batch["attention_mask"].sum(1)
    assert batch["input_ids"].shape[1] == lengths.max()  # padded to the longest in the batch, no further
    assert sum(len(b["target"]) for b in dm.val_dataloader()) == 6  # val keeps its last partial batch


@pytest.mark.parametrize("file_name", ["demo.tokens.jsonl", "demo.efb1", "demo.text.jsonl"])
def test_every_format_gives_the_same_batches(tiny_demo, file_name):
    reference = TextBridgeDataModule(path=str(tiny_demo), batch_size=16, max_len=12)
    dm = TextBridgeDataModule(path=str(tiny_demo / file_name), batch_size=16, max_len=12)
    with pytest.warns(UserWarning, match=r"\d+ of 60 samples are longer than data.max_len=12"):
        dm.setup()
    with pytest.warns(UserWarning):
        reference.setup()
    assert dm.vocab_size == reference.vocab_size  # tokenizer.json beside the file
    for a, b in zip(dm.train_dataloader(), reference.train_dataloader()):
        for key in a:
            assert torch.equal(a[key], b[key]), key
        assert a["input_ids"].shape[1] <= 12


def test_split_is_seeded(tiny_demo):
    def split(seed):
        dm = TextBridgeDataModule(path=str(tiny_demo), seed=seed, val_fraction=0.25)
        dm.setup()
        return dm.train_dataset.indices.tolist(), dm.val_dataset.indices.tolist()

    train, val = split(0)
    assert split(0) == (train, val)
    assert sorted(train + val) == list(range(60)) and len(val) == 15
    assert split(1)[1] != val

    def first_batch_targets(seed):
        dm = TextBridgeDataModule(path=str(tiny_demo), seed=seed, batch_size=4)
        return next(iter(dm.train_dataloader()))["target"]

    assert torch.equal(first_batch_targets(3), first_batch_targets(3))  # shuffling is seeded too


def test_collate_pads_right_with_pad_id():
    batch = [
        {"input_ids": torch.tensor([5, 6, 7]), "attention_mask": torch.tensor([1, 1, 0]), "target": torch.ones(2)},
        {"input_ids": torch.tensor([8]), "attention_mask": torch.tensor([1]), "target": torch.zeros(2)},
        {
            "input_ids": torch.tensor([], dtype=torch.int64),
            "attention_mask": torch.tensor([], dtype=torch.int64),
            "target": torch.ones(2),
        },
    ]
    out = collate_textbridge(batch, pad_id=9)
    assert out["input_ids"].tolist() == [[5, 6, 7], [8, 9, 9], [9, 9, 9]]
    assert out["attention_mask"].tolist() == [[1, 1, 0], [1, 0, 0], [0, 0, 0]]
    assert out["input_ids"].dtype == out["attention_mask"].dtype == torch.int64
    assert out["target"].dtype == torch.float32 and out["target"].shape == (3, 2)
    empty_only = collate_textbridge(batch[2:], pad_id=0)
    assert empty_only["input_ids"].shape == (1, 1) and empty_only["attention_mask"].sum() == 0


def _token_file(tmp_path: Path, ids_per_sample: list[list[int]], fmt: str = "efb1") -> Path:
    samples = [
        Sample(
            target=np.ones(4, np.float32),
            text=f"t{i}",
            input_ids=np.array(ids),
            attention_mask=np.ones(len(ids), np.uint8),
        )
        for i, ids in enumerate(ids_per_sample)
    ]
    path = tmp_path / f"data.{fmt}"
    (write_efb1(path, samples) if fmt == "efb1" else write_jsonl(path, samples, mode="tokens"))
    return path


@pytest.mark.parametrize(("fmt", "where"), [("efb1", "record 2"), ("jsonl", "line 3")])
def test_check_vocab_names_the_first_offending_record(tmp_path, fmt, where):
    path = _token_file(tmp_path, [[1, 2], [3], [4, 40], [50], [2]], fmt)
    dm = TextBridgeDataModule(path=str(path), batch_size=2, val_fraction=0.2)
    assert dm.vocab_size == 51  # no tokenizer beside the file: the largest id + 1
    dm.check_vocab(51)
    with pytest.raises(DataFormatError) as error:
        dm.check_vocab(30)
    assert str(error.value).startswith(f"{path}:{where}: token id 40 >= model vocab_size 30")


def test_check_vocab_on_text_mode(tiny_demo):
    dm = TextBridgeDataModule(path=str(tiny_demo / "demo.text.jsonl"))
    dm.check_vocab(dm.vocab_size)
    with pytest.raises(DataFormatError, match=r"demo\.text\.jsonl:line \d+: token id \d+ >= model vocab_size 10"):
        dm.check_vocab(10)


def test_too_long_error_names_the_record(tmp_path):
    path = _token_file(tmp_path, [[1, 2], [3, 4, 5, 6], [7]], "jsonl")
    dm = TextBridgeDataModule(path=str(path), max_len=3, too_long="error", val_fraction=0.0)
    with pytest.raises(DataFormatError) as error:
        dm.setup()
    assert str(error.value).startswith(f"{path}:line 2: 4 tokens > data.max_len=3")


def test_text_mode_without_tokenizer_is_a_clear_error(tmp_path):
    path = tmp_path / "plain.jsonl"
    write_jsonl(path, [Sample(target=np.ones(3, np.float32), text="hello")], mode="text")
    with pytest.raises(
        DataFormatError, match="needs a tokenizer: put tokenizer.json beside it or set data.tokenizer_path"
    ):
        TextBridgeDataModule(path=str(path)).setup()


def test_text_mode_with_explicit_tokenizer_path(tiny_demo, tmp_path):
    texts = demo_sentences()[:10]
    path = tmp_path / "mine.jsonl"
    write_jsonl(path, [Sample(target=np.full(3, i, np.float32), text=t) for i, t in enumerate(texts)], mode="text")
    dm = TextBridgeDataModule(
        path=str(path), tokenizer_path=str(tiny_demo / "tokenizer.json"), batch_size=4, val_fraction=0.2
    )
    batch = next(iter(dm.train_dataloader()))
    tokenizer = TextTokenizer.load(tiny_demo / "tokenizer.json")
    first = int(batch["target"][0, 0])
    expected = tokenizer.encode([texts[first]], 128)[0][0]
    assert batch["input_ids"][0, : len(expected)].tolist() == expected


def test_small_train_set_keeps_its_partial_batch(tmp_path):
    path = _token_file(tmp_path, [[1]] * 5)
    dm = TextBridgeDataModule(path=str(path), batch_size=64, val_fraction=0.2)
    with pytest.warns(UserWarning, match="keeping the partial batch"):
        batches = list(dm.train_dataloader())
    assert [len(b["target"]) for b in batches] == [4]


def test_workers_read_the_source_in_their_own_process(tiny_demo):
    dm = TextBridgeDataModule(path=str(tiny_demo / "demo.efb1"), batch_size=16, num_workers=1)
    with_workers = [batch["target"] for batch in dm.val_dataloader()]
    dm.num_workers = 0
    in_process = [batch["target"] for batch in dm.val_dataloader()]
    assert len(with_workers) == len(in_process) and all(map(torch.equal, with_workers, in_process))


def test_invalid_datamodule_arguments():
    """The bounds are the annotations (one place), which the plan's bind and the early check both read."""
    from sweeplab.core.config import bind
    from sweeplab.core.errors import ConfigError

    with pytest.raises(ConfigError, match="data.too_long: expected 'truncate' | 'error', got 'drop'"):
        bind(TextBridgeDataModule, {"too_long": "drop"}, "data")
    with pytest.raises(ConfigError, match=r"data.val_fraction: must be in \[0, 1\), got 1.0"):
        bind(TextBridgeDataModule, {"val_fraction": 1.0}, "data")


def test_manifest_is_json_with_counts(tiny_demo):
    manifest = json.loads((tiny_demo / "manifest.json").read_text())
    assert {"settings", "num_samples", "num_truncated", "target_dim", "vocab_size", "formats", "files"} <= set(manifest)
    assert os.access(tiny_demo / "demo.efb1", os.R_OK)
