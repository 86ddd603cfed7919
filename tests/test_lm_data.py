import numpy as np
import pytest
import torch

from sweeplab.families.pagating_lm import data as lm
from sweeplab.families.pagating_lm.data import LMDataModule, resolve_sources

TEXT = {
    "train": "The quick brown fox jumps over the lazy dog.\n" * 200
    + "Pack my box with five dozen liquor jugs.\n" * 100,
    "valid": "Sphinx of black quartz, judge my vow.\n" * 40,
    "test": "How vexingly quick daft zebras jump!\n" * 40,
}


def write_splits(root, names=("train.txt", "valid.txt", "test.txt"), texts=TEXT):
    root.mkdir(parents=True, exist_ok=True)
    for name, split in zip(names, ("train", "valid", "test")):
        (root / name).write_text(texts[split], encoding="utf-8")
    return root


def datamodule(tmp_path, path, **kwargs) -> LMDataModule:
    kwargs = {"cache_dir": tmp_path / "cache", "block_size": 16, "batch_size": 4, "vocab_size": 300, **kwargs}
    dm = LMDataModule(path=path, **kwargs)
    dm.prepare_data()
    dm.setup("fit")
    return dm


@pytest.fixture
def count_tokenisations(monkeypatch):
    calls = []
    original = lm.tokenize_to_file

    def counting(source, tokenizer, target):
        calls.append(source.split)
        return original(source, tokenizer, target)

    monkeypatch.setattr(lm, "tokenize_to_file", counting)
    return calls


def test_cache_is_written_once_then_reused(tmp_path, count_tokenisations):
    data = write_splits(tmp_path / "data")
    first = datamodule(tmp_path, data)
    assert sorted(count_tokenisations) == ["test", "train", "valid"]
    files = sorted(p.name for p in (tmp_path / "cache").iterdir())
    assert len([f for f in files if f.endswith(".uint16.bin")]) == 3 and any(f.startswith("tokenizer-") for f in files)
    assert not any(f.endswith(".tmp") for f in files)
    mtimes = {p: p.stat().st_mtime_ns for p in (tmp_path / "cache").iterdir()}

    second = datamodule(tmp_path, data)
    assert len(count_tokenisations) == 3  # nothing re-tokenised
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "cache").iterdir()} == mtimes
    assert second.vocab_size == first.vocab_size

    (data / "valid.txt").write_text(TEXT["valid"] + "A changed file is tokenised again.\n", encoding="utf-8")
    datamodule(tmp_path, data)
    assert count_tokenisations[3:] == ["valid"]


def test_blocks_are_contiguous_slices_with_shifted_labels(tmp_path):
    dm = datamodule(tmp_path, write_splits(tmp_path / "data"))
    T = dm.block_size
    for split in ("train", "valid"):
        dataset = dm.datasets[split]
        stream = np.fromfile(dataset.path, dtype=dataset.dtype).astype(np.int64)
        assert len(dataset) == (len(stream) - 1) // T
        for i in (0, 1, len(dataset) - 1):
            item = dataset[i]
            assert item["input_ids"].tolist() == stream[i * T : i * T + T].tolist()
            assert item["labels"].tolist() == stream[i * T + 1 : i * T + T + 1].tolist()
    # the stream is the text, nothing added: decoding it gives the file back
    stream = np.fromfile(dm.datasets["valid"].path, dtype=dm.datasets["valid"].dtype).tolist()
    assert dm.tokenizer.decode(stream) == TEXT["valid"]


def test_batches_have_no_padding_and_right_shapes(tmp_path):
    dm = datamodule(tmp_path, write_splits(tmp_path / "data"))
    assert dm.tokenizer.token_to_id("<pad>") is None and dm.tokenizer.get_vocab_size() <= 300
    eot = dm.tokenizer.token_to_id(lm.END_OF_TEXT)
    for loader in (dm.train_dataloader(), dm.val_dataloader()):
        for batch in loader:
            assert set(batch) == {"input_ids", "labels"}
            for tensor in batch.values():
                assert tensor.dtype == torch.int64 and tensor.shape[1] == dm.block_size
                assert (tensor != eot).all() and (tensor >= 0).all() and (tensor < dm.vocab_size).all()
            assert torch.equal(batch["input_ids"][:, 1:], batch["labels"][:, :-1])
    train_batch = next(iter(dm.train_dataloader()))
    assert train_batch["input_ids"].shape == (dm.batch_size, dm.block_size)


def test_train_order_is_seeded_val_order_fixed(tmp_path):
    data = write_splits(tmp_path / "data")

    def first_batches(seed):
        dm = datamodule(tmp_path, data, seed=seed)
        return next(iter(dm.train_dataloader()))["input_ids"], next(iter(dm.val_dataloader()))["input_ids"]

    train_a, val_a = first_batches(0)
    train_b, val_b = first_batches(0)
    train_c, val_c = first_batches(1)
    assert torch.equal(train_a, train_b) and not torch.equal(train_a, train_c)
    assert torch.equal(val_a, val_c)
    dm = datamodule(tmp_path, data)
    assert torch.equal(val_a[1], dm.datasets["valid"][1]["input_ids"])


def test_max_train_tokens_truncates(tmp_path):
    dm = datamodule(tmp_path, write_splits(tmp_path / "data"), max_train_tokens=16 * 5 + 1)
    assert len(dm.datasets["train"]) == 5


def test_wikitext_names(tmp_path):
    data = write_splits(tmp_path / "wt", names=("wiki.train.raw", "wiki.valid.raw", "wiki.test.raw"))
    dm = datamodule(tmp_path, data)
    assert dm.sources["valid"].name.endswith("wiki.valid.raw")
    assert len(dm.datasets["test"]) > 0


def test_local_tokenizer_dir(tmp_path, count_tokenisations):
    data = write_splits(tmp_path / "data")
    trained = datamodule(tmp_path, data).tokenizer
    (tmp_path / "tok").mkdir()
    trained.save(str(tmp_path / "tok" / "tokenizer.json"))
    dm = datamodule(tmp_path, data, tokenizer_path=tmp_path / "tok")
    assert dm.vocab_size == trained.get_vocab_size()
    assert len(count_tokenisations) == 3  # same tokenizer content -> same cache
    with pytest.raises(ValueError, match="nowhere"):
        datamodule(tmp_path, data, tokenizer_path=tmp_path / "nowhere")


def test_offline_default_corpus(tmp_path):
    sources = resolve_sources(None)
    assert set(sources) == {"train", "valid", "test"} and all(s.text for s in sources.values())
    dm = datamodule(tmp_path, None, block_size=64, vocab_size=512)
    assert dm.vocab_size == 512 and len(dm.datasets["train"]) > 100


def test_error_missing_dir(tmp_path):
    with pytest.raises(ValueError, match="nope.*no such directory"):
        datamodule(tmp_path, tmp_path / "nope")


def test_error_missing_split_names_it(tmp_path):
    data = write_splits(tmp_path / "data")
    (data / "test.txt").unlink()
    with pytest.raises(ValueError, match=r"no test\.txt or wiki\.test\.raw"):
        datamodule(tmp_path, data)


def test_error_empty_file(tmp_path):
    data = write_splits(tmp_path / "data")
    (data / "valid.txt").write_bytes(b"")
    with pytest.raises(ValueError, match=r"valid\.txt: empty file"):
        datamodule(tmp_path, data)


def test_error_not_utf8_names_file_and_leaves_no_cache(tmp_path):
    data = write_splits(tmp_path / "data")
    (data / "test.txt").write_bytes("caf\u00e9\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"test\.txt: not valid UTF-8 at byte 3"):
        datamodule(tmp_path, data)
    assert not any(p.name.startswith(("test-", ".test-")) for p in (tmp_path / "cache").iterdir())


def test_error_split_shorter_than_a_block(tmp_path):
    data = write_splits(tmp_path / "data")
    (data / "valid.txt").write_text("tiny\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"valid\.txt: \d+ tokens, shorter than one block"):
        datamodule(tmp_path, data)


def test_bad_arguments():
    with pytest.raises(ValueError, match="vocab_size"):
        LMDataModule(vocab_size=100)
    with pytest.raises(ValueError, match="max_train_tokens"):
        LMDataModule(block_size=64, max_train_tokens=10)
