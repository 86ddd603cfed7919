"""Record formats: round trips, lazy random access, directory resolution, atomic writers and every malformed input."""

from __future__ import annotations

import json
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest

from sweeplab.families.textbridge.formats import (
    DataFormatError,
    Efb1Source,
    JsonlSource,
    Sample,
    open_dataset,
    write_efb1,
    write_jsonl,
)

TARGET_DIM = 8


def make_samples(n: int = 6, dim: int = TARGET_DIM, seed: int = 0) -> list[Sample]:
    rng = np.random.default_rng(seed)
    samples = []
    for i in range(n):
        length = int(rng.integers(0, 12)) if i else 0  # one empty sequence: legal in every format
        mask = np.ones(length, dtype=np.uint8)
        mask[length // 2 :] = rng.integers(0, 2, size=length - length // 2)
        samples.append(
            Sample(
                target=(rng.standard_normal(dim) * 10.0 ** rng.integers(-8, 8)).astype(np.float32),
                text=f"sample {i}: ünïcode “quotes” and a tab\t{i}",
                input_ids=rng.integers(0, 2**32 - 1 if i == 1 else 500, size=length).astype(np.int64),
                attention_mask=mask,
            )
        )
    return samples


def assert_one_line_at(error: pytest.ExceptionInfo, path: Path, where: str) -> str:
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(f"{path}:{where}: "), message
    return message


# --- round trips ---------------------------------------------------------------------------------


def test_jsonl_text_round_trip(tmp_path):
    samples = make_samples()
    path = tmp_path / "data.jsonl"
    assert write_jsonl(path, samples, mode="text") == len(samples)

    source = open_dataset(path)
    assert isinstance(source, JsonlSource)
    assert (len(source), source.target_dim, source.has_text, source.has_tokens) == (
        len(samples),
        TARGET_DIM,
        True,
        False,
    )
    assert source.path == path
    for original, read in zip(samples, source):
        assert read.text == original.text
        assert read.input_ids is None and read.attention_mask is None
        assert read.target.dtype == np.float32
        np.testing.assert_array_equal(read.target, original.target)  # 9 significant digits: float32 exact
    assert all("input_ids" not in json.loads(line) for line in path.read_text(encoding="utf-8").splitlines())


def test_jsonl_tokens_round_trip(tmp_path):
    samples = make_samples()
    path = tmp_path / "data.jsonl"
    write_jsonl(path, samples, mode="tokens")

    source = open_dataset(path)
    assert (source.has_text, source.has_tokens) == (True, True)
    assert source.max_token_id == max(int(s.input_ids.max()) for s in samples if s.input_ids.size)
    np.testing.assert_array_equal(source.token_lengths, [s.input_ids.size for s in samples])
    for original, read in zip(samples, source):
        assert read.text == original.text
        assert read.input_ids.dtype == np.int64 and read.attention_mask.dtype == np.uint8
        np.testing.assert_array_equal(read.input_ids, original.input_ids)
        np.testing.assert_array_equal(read.attention_mask, original.attention_mask)
        np.testing.assert_array_equal(read.target, original.target)


def test_token_jsonl_without_text_is_allowed(tmp_path):
    samples = make_samples(3)
    for sample in samples:
        sample.text = None
    path = tmp_path / "data.jsonl"
    write_jsonl(path, samples, mode="tokens")
    source = open_dataset(path)
    assert (source.has_text, source.has_tokens) == (False, True)
    assert source[0].text is None


def test_efb1_round_trip_is_bit_exact(tmp_path):
    samples = make_samples()
    path = tmp_path / "data.efb1"
    assert write_efb1(path, samples) == len(samples)

    # The layout byte by byte, as docs/data-formats.md#efb1 states it.
    expected = bytearray(struct.pack("<4sII", b"EFB1", len(samples), TARGET_DIM))
    for s in samples:
        expected += struct.pack("<I", s.input_ids.size)
        expected += s.input_ids.astype("<u4").tobytes() + s.attention_mask.tobytes() + s.target.astype("<f4").tobytes()
    assert path.read_bytes() == bytes(expected)

    source = open_dataset(path)
    assert isinstance(source, Efb1Source)
    assert (len(source), source.target_dim, source.has_text, source.has_tokens) == (
        len(samples),
        TARGET_DIM,
        False,
        True,
    )
    for original, read in zip(samples, source):
        assert read.text is None
        assert read.input_ids.dtype == np.int64 and read.attention_mask.dtype == np.uint8
        assert read.target.dtype == np.float32
        np.testing.assert_array_equal(read.input_ids, original.input_ids)
        np.testing.assert_array_equal(read.attention_mask, original.attention_mask)
        assert read.target.tobytes() == original.target.tobytes()

    rewritten = tmp_path / "again.efb1"
    write_efb1(rewritten, iter(source))  # a generator works: the header count is written at the end
    assert rewritten.read_bytes() == path.read_bytes()


def test_efb1_is_recognised_by_magic_whatever_the_extension(tmp_path):
    path = tmp_path / "data.bin"
    write_efb1(path, make_samples(2))
    assert isinstance(open_dataset(path), Efb1Source)


def test_random_access_reads_lazily(tmp_path):
    samples = make_samples(5)
    path = tmp_path / "data.efb1"
    write_efb1(path, samples)
    source = open_dataset(path)
    np.testing.assert_array_equal(source[-1].target, samples[-1].target)
    np.testing.assert_array_equal(source[2].target, samples[2].target)
    with pytest.raises(IndexError):
        source[5]
    # Records come from disk on access, not from memory: an in-place edit after indexing shows up.
    last_target_offset = path.stat().st_size - 4 * TARGET_DIM
    with open(path, "r+b") as f:
        f.seek(last_target_offset)
        f.write(np.full(TARGET_DIM, 7.0, dtype="<f4").tobytes())
    np.testing.assert_array_equal(source[4].target, np.full(TARGET_DIM, 7.0, dtype=np.float32))


def test_source_pickles_without_its_file_handle(tmp_path):
    path = tmp_path / "data.jsonl"
    write_jsonl(path, make_samples(3), mode="tokens")
    source = open_dataset(path)
    source[0]  # opens the handle
    clone = pickle.loads(pickle.dumps(source))  # what a DataLoader worker receives
    np.testing.assert_array_equal(clone[1].target, source[1].target)
    source.close()


def test_blank_lines_are_skipped_and_counted_in_line_numbers(tmp_path):
    path = tmp_path / "data.jsonl"
    good = json.dumps({"text": "a", "target": [1.0, 2.0]})
    path.write_text(f"{good}\n\n{good}\n\n{{broken\n", encoding="utf-8")
    with pytest.raises(DataFormatError) as error:
        open_dataset(path)
    assert_one_line_at(error, path, "line 5")
    path.write_text(f"\n{good}\n\n{good}\n\n", encoding="utf-8")
    source = open_dataset(path)
    assert len(source) == 2 and source.locate(1) == f"{path}:line 4"
    assert source[1].text == "a"


# --- directories ---------------------------------------------------------------------------------


def test_directory_with_one_data_file(tmp_path):
    write_efb1(tmp_path / "only.efb1", make_samples(2))
    (tmp_path / "notes.txt").write_text("not data")
    assert open_dataset(tmp_path).path == tmp_path / "only.efb1"


@pytest.mark.parametrize("names", [[], ["a.jsonl", "b.efb1"]])
def test_directory_without_exactly_one_data_file_is_an_error(tmp_path, names):
    for name in names:
        (write_jsonl if name.endswith(".jsonl") else write_efb1)(tmp_path / name, make_samples(2))
    with pytest.raises(DataFormatError, match="exactly one .jsonl/.efb1") as error:
        open_dataset(tmp_path)
    assert str(error.value).startswith(f"{tmp_path}: ")


def test_directory_manifest_prefers_tokens_then_efb1_then_text(tmp_path):
    samples = make_samples(2)
    files = {"tokens_jsonl": "d.tokens.jsonl", "efb1": "d.efb1", "text_jsonl": "d.text.jsonl"}
    (tmp_path / "manifest.json").write_text(json.dumps({"files": files}))
    write_jsonl(tmp_path / files["text_jsonl"], samples, mode="text")
    assert open_dataset(tmp_path).path.name == "d.text.jsonl"
    write_efb1(tmp_path / files["efb1"], samples)
    assert open_dataset(tmp_path).path.name == "d.efb1"
    write_jsonl(tmp_path / files["tokens_jsonl"], samples, mode="tokens")
    assert open_dataset(tmp_path).path.name == "d.tokens.jsonl"


# --- atomic writers ------------------------------------------------------------------------------


@pytest.mark.parametrize("writer", ["jsonl", "efb1"])
def test_failed_write_leaves_the_previous_file_and_no_temp_file(tmp_path, writer):
    path = tmp_path / f"data.{writer}"
    write = write_efb1 if writer == "efb1" else write_jsonl
    write(path, make_samples(2))
    before = path.read_bytes()

    def crashing_samples():
        yield from make_samples(3, seed=1)
        raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError, match="disk on fire"):
        write(path, crashing_samples())
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]


def test_failed_first_write_leaves_no_file(tmp_path):
    path = tmp_path / "new.efb1"

    def crashing_samples():
        yield make_samples(1)[0]
        raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError):
        write_efb1(path, crashing_samples())
    assert list(tmp_path.iterdir()) == []


def test_text_mode_writer_needs_text(tmp_path):
    sample = make_samples(1)[0]
    sample.text = None
    with pytest.raises(ValueError, match="no text"):
        write_jsonl(tmp_path / "x.jsonl", [sample], mode="text")


# --- malformed JSONL -----------------------------------------------------------------------------

GOOD_TEXT = {"text": "ok", "target": [0.5, -1.0]}
GOOD_TOKENS = {"text": "ok", "input_ids": [3, 4], "attention_mask": [1, 1], "target": [0.5, -1.0]}


def _line(record) -> bytes:
    return record if isinstance(record, bytes) else json.dumps(record).encode()


@pytest.mark.parametrize(
    ("first", "bad", "expected"),
    [
        (GOOD_TEXT, b'{"text": "x", "target": [1.0, 2.0]', "invalid JSON"),
        (GOOD_TEXT, b'{"text": "caf\xe9", "target": [1.0, 2.0]}', "not valid UTF-8"),
        (GOOD_TEXT, [1, 2], "expected a JSON object"),
        (GOOD_TEXT, {"text": "x"}, "missing 'target'"),
        (GOOD_TEXT, {"target": [1.0, 2.0]}, "missing 'text'"),
        (GOOD_TEXT, {"text": 7, "target": [1.0, 2.0]}, "'text' must be a string"),
        (GOOD_TEXT, {"text": "x", "target": "1.0 2.0"}, "'target' must be a list of numbers"),
        (GOOD_TEXT, {"text": "x", "target": [1.0, "2.0"]}, "'target' must be a list of numbers"),
        (GOOD_TEXT, {"text": "x", "target": [1.0, True]}, "'target' must be a list of numbers"),
        (GOOD_TEXT, {"text": "x", "target": [1.0, 2.0, 3.0]}, "'target' has 3 values, the first record has 2"),
        (GOOD_TEXT, b'{"text": "x", "target": [1.0, NaN]}', "NaN or Inf"),
        (GOOD_TEXT, b'{"text": "x", "target": [-Infinity, 1.0]}', "NaN or Inf"),
        (GOOD_TEXT, b'{"text": "x", "target": [1e999, 1.0]}', "NaN or Inf"),
        (GOOD_TEXT, {**GOOD_TOKENS}, "has token fields but the first record is text mode"),
        (GOOD_TOKENS, {"text": "x", "input_ids": [1], "target": [1.0, 2.0]}, "missing 'attention_mask'"),
        (GOOD_TOKENS, {**GOOD_TOKENS, "input_ids": [1.0, 2.0]}, "'input_ids' must be a list of integers"),
        (GOOD_TOKENS, {**GOOD_TOKENS, "attention_mask": "11"}, "'attention_mask' must be a list of integers"),
        (GOOD_TOKENS, {**GOOD_TOKENS, "attention_mask": [1]}, "'input_ids' has 2 tokens but 'attention_mask' has 1"),
        (GOOD_TOKENS, {**GOOD_TOKENS, "attention_mask": [1, 2]}, "values must be 0 or 1"),
        (GOOD_TOKENS, {**GOOD_TOKENS, "input_ids": [5, -1]}, "negative id"),
        (GOOD_TOKENS, {**GOOD_TOKENS, "text": None}, None),  # token mode: text is optional
    ],
)
def test_malformed_jsonl_names_file_and_line(tmp_path, first, bad, expected):
    path = tmp_path / "data.jsonl"
    path.write_bytes(_line(first) + b"\n" + _line(first) + b"\n" + _line(bad) + b"\n" + _line(first) + b"\n")
    if expected is None:
        assert len(open_dataset(path)) == 4
        return
    with pytest.raises(DataFormatError) as error:
        open_dataset(path)
    assert expected in assert_one_line_at(error, path, "line 3")


def test_empty_target_in_first_record(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_text(json.dumps({"text": "x", "target": []}) + "\n")
    with pytest.raises(DataFormatError) as error:
        open_dataset(path)
    assert "'target' is empty" in assert_one_line_at(error, path, "line 1")


@pytest.mark.parametrize("name", ["data.jsonl", "data.efb1"])
def test_empty_file(tmp_path, name):
    path = tmp_path / name
    path.write_bytes(b"")
    with pytest.raises(DataFormatError) as error:
        open_dataset(path)
    assert "empty file" in assert_one_line_at(error, path, "line 1")


def test_blank_only_jsonl(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_text("\n  \n")
    with pytest.raises(DataFormatError, match="no records"):
        open_dataset(path)


def test_missing_file(tmp_path):
    path = tmp_path / "absent.jsonl"
    with pytest.raises(DataFormatError) as error:
        open_dataset(path)
    assert str(error.value) == f"{path}: no such file or directory"


def test_unknown_extension_without_magic(tmp_path):
    path = tmp_path / "data.csv"
    path.write_text("text,target\n")
    with pytest.raises(DataFormatError, match="unknown format"):
        open_dataset(path)


# --- malformed EFB1 ------------------------------------------------------------------------------


def _efb1_bytes(samples: list[Sample], num_samples: int | None = None) -> bytes:
    out = bytearray(struct.pack("<4sII", b"EFB1", len(samples) if num_samples is None else num_samples, TARGET_DIM))
    for s in samples:
        out += struct.pack("<I", s.input_ids.size)
        out += s.input_ids.astype("<u4").tobytes() + s.attention_mask.tobytes() + s.target.astype("<f4").tobytes()
    return bytes(out)


def _efb1_case(case: str) -> tuple[bytes, str, str]:
    samples = make_samples(3)
    samples[1].input_ids = np.array([1, 2, 3])
    samples[1].attention_mask = np.array([1, 1, 0], dtype=np.uint8)
    good = _efb1_bytes(samples)
    if case == "bad magic":
        return b"EFB2" + good[4:], "record 0", "bad magic"
    if case == "truncated header":
        return good[:7], "record 0", "truncated header"
    if case == "truncated record":
        return good[:-3], "record 2", "truncated record"
    if case == "truncated length field":
        return _efb1_bytes(samples[:2], num_samples=3) + b"\x01\x00", "record 2", "truncated record"
    if case == "huge length":
        return _efb1_bytes(samples[:2], num_samples=3) + struct.pack("<I", 2**31), "record 2", "truncated record"
    if case == "header count too large":
        return _efb1_bytes(samples, num_samples=5), "record 3", "header says 5 samples, the file holds 3"
    if case == "header count too small":
        return _efb1_bytes(samples, num_samples=2), "record 2", "header says 2 samples but"
    if case == "zero samples":
        return _efb1_bytes([], num_samples=0), "record 0", "no records"
    if case == "mask value":
        samples[1].attention_mask = np.array([1, 2, 0], dtype=np.uint8)
        return _efb1_bytes(samples), "record 1", "0 or 1"
    if case == "nan target":
        samples[1].target[3] = np.nan
        return _efb1_bytes(samples), "record 1", "NaN or Inf"
    raise AssertionError(case)


@pytest.mark.parametrize(
    "case",
    [
        "bad magic",
        "truncated header",
        "truncated record",
        "truncated length field",
        "huge length",
        "header count too large",
        "header count too small",
        "zero samples",
        "mask value",
        "nan target",
    ],
)
def test_malformed_efb1_names_file_and_record(tmp_path, case):
    content, where, expected = _efb1_case(case)
    path = tmp_path / "data.efb1"
    path.write_bytes(content)
    with pytest.raises(DataFormatError) as error:
        open_dataset(path)
    assert expected in assert_one_line_at(error, path, where)
