"""TextBridge record formats: JSONL (text or token mode) and EFB1, with atomic writers and a lazy reader.

Formats (docs/data-formats.md#textbridge-records):
- JSONL text mode:  {"text": str, "target": [float x dim]}
- JSONL token mode: adds "input_ids": [int] and "attention_mask": [0/1]; the ids are used as they are.
- EFB1 (little-endian): b"EFB1", u32 num_samples, u32 embed_dim; per sample u32 L, L x u32 ids, L x u8 mask,
  embed_dim x f32 target. No text.

`open_dataset(path)` validates the whole file in one streaming pass and keeps only byte offsets (plus a token count
per record), so a file larger than memory works; a record is read back by seeking when it is asked for.
"""

from __future__ import annotations

import json
import os
import struct
from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import BinaryIO

import numpy as np

from sweeplab.core.errors import DataFormatError
from sweeplab.core.files import atomic_write
from sweeplab.data.tokenizer import TextTokenizer

EFB1_MAGIC = b"EFB1"
_EFB1_HEADER = struct.Struct("<4sII")  # magic, num_samples, embed_dim
_U32 = struct.Struct("<I")
_U32_MAX = 2**32 - 1

MANIFEST_NAME = "manifest.json"
# manifest "files" keys, most useful first: token JSONL needs no tokenizer and keeps the text, EFB1 is compact.
FORMAT_PREFERENCE = ("tokens_jsonl", "efb1", "text_jsonl")
DATA_SUFFIXES = (".jsonl", ".efb1")




@dataclass
class Sample:
    """One record. Text-mode JSONL has no ids; EFB1 has no text."""

    target: np.ndarray  # float32, (target_dim,)
    text: str | None = None
    input_ids: np.ndarray | None = None  # int64, (L,)
    attention_mask: np.ndarray | None = None  # uint8 0/1, (L,)


# --- writing -------------------------------------------------------------------------------------


def _float32_list(values: np.ndarray) -> list[float]:
    # 9 significant digits round-trip any float32 exactly and are about half as long as float64 reprs.
    return [float(format(v, ".9g")) for v in np.asarray(values, dtype=np.float32).tolist()]


def write_jsonl(path: str | os.PathLike, samples: Iterable[Sample], mode: str = "text") -> int:
    """Write samples as JSONL ("text": text + target; "tokens": also input_ids + attention_mask). Returns the count."""
    if mode not in ("text", "tokens"):
        raise ValueError(f"write_jsonl mode={mode!r} is not 'text' or 'tokens'")
    count = 0
    with atomic_write(path) as f:
        for i, sample in enumerate(samples):
            record: dict = {}
            if sample.text is not None:
                record["text"] = sample.text
            elif mode == "text":
                raise ValueError(f"{path}: sample {i} has no text; text-mode JSONL needs it (use mode='tokens')")
            if mode == "tokens":
                if sample.input_ids is None or sample.attention_mask is None:
                    raise ValueError(f"{path}: sample {i} has no input_ids/attention_mask for token-mode JSONL")
                record["input_ids"] = np.asarray(sample.input_ids, dtype=np.int64).tolist()
                record["attention_mask"] = np.asarray(sample.attention_mask, dtype=np.uint8).tolist()
            record["target"] = _float32_list(sample.target)
            f.write(json.dumps(record, ensure_ascii=False, allow_nan=False).encode("utf-8"))
            f.write(b"\n")
            count += 1
    return count


def write_efb1(path: str | os.PathLike, samples: Iterable[Sample]) -> int:
    """Write samples as EFB1. The header's count is patched in at the end, so `samples` may be a generator."""
    count, embed_dim = 0, None
    with atomic_write(path) as f:
        f.write(_EFB1_HEADER.pack(EFB1_MAGIC, 0, 0))
        for i, sample in enumerate(samples):
            if sample.input_ids is None or sample.attention_mask is None:
                raise ValueError(f"{path}: sample {i} has no input_ids/attention_mask; EFB1 stores tokens only")
            ids = np.asarray(sample.input_ids)
            mask = np.asarray(sample.attention_mask)
            target = np.asarray(sample.target, dtype=np.float32)
            if embed_dim is None:
                embed_dim = target.shape[0]
            if target.shape != (embed_dim,):
                raise ValueError(f"{path}: sample {i} target has shape {target.shape}, the first had ({embed_dim},)")
            if ids.shape != mask.shape or ids.ndim != 1:
                raise ValueError(f"{path}: sample {i} input_ids {ids.shape} and attention_mask {mask.shape} differ")
            if ids.size and (ids.min() < 0 or ids.max() > _U32_MAX):
                raise ValueError(f"{path}: sample {i} has token ids outside the u32 range of EFB1")
            f.write(_U32.pack(ids.size))
            f.write(ids.astype("<u4").tobytes())
            f.write(mask.astype(np.uint8).tobytes())
            f.write(target.astype("<f4").tobytes())
            count += 1
        f.seek(0)
        f.write(_EFB1_HEADER.pack(EFB1_MAGIC, count, embed_dim or 0))
    return count


# --- reading -------------------------------------------------------------------------------------


class SampleSource:
    """Random access to the records of one file; holds an index of offsets, reads a record on access.

    Attributes after the index pass: `path`, `target_dim`, `has_tokens`, `has_text`, `max_token_id` (-1 without
    tokens), `max_token_record` (the index of the first record holding it), `unmasked_tokens` (how many tokens have
    attention_mask 1, in all records) and `token_lengths` (int32 per record, None without tokens).
    """

    path: Path
    target_dim: int
    has_tokens: bool
    has_text: bool
    max_token_id: int
    max_token_record: int = -1
    unmasked_tokens: int = 0
    token_lengths: np.ndarray | None

    def __init__(self, path: Path):
        self.path = path
        self._file: BinaryIO | None = None
        self._file_pid: int | None = None

    def __len__(self) -> int:
        raise NotImplementedError

    def __getitem__(self, index: int) -> Sample:
        return self._read(self._check_index(index))

    def __iter__(self) -> Iterator[Sample]:
        for i in range(len(self)):
            yield self._read(i)

    def locate(self, index: int) -> str:
        """Where record `index` lives, for error messages: "<path>:line N" or "<path>:record N"."""
        raise NotImplementedError

    def _read(self, index: int) -> Sample:
        raise NotImplementedError

    def _read_at(self, offset: int, size: int) -> bytes:
        f = self._handle()
        f.seek(offset)
        chunks, remaining = [], size
        while remaining:  # an unbuffered read may return less than asked
            chunk = f.read(remaining)
            if not chunk:
                raise DataFormatError(f"{self.path}: file shrank since it was indexed; open it again")
            chunks.append(chunk)
            remaining -= len(chunk)
        return b"".join(chunks)

    def _check_index(self, index: int) -> int:
        n = len(self)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(f"{self.path}: index {index} out of range for {n} records")
        return index

    def _handle(self) -> BinaryIO:
        # One handle per process: DataLoader workers fork, and a shared handle would share its file position.
        pid = os.getpid()
        if self._file is None or self._file_pid != pid:
            # Unbuffered: random access gains nothing from read-ahead, and reads always see the file as it is now.
            self._file = open(self.path, "rb", buffering=0)  # noqa: SIM115 (kept open for the life of the source)
            self._file_pid = pid
        return self._file

    def close(self) -> None:
        if self._file is not None and self._file_pid == os.getpid():
            self._file.close()
        self._file = None

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_file"] = None
        state["_file_pid"] = None
        return state

    def __repr__(self) -> str:
        kind = "tokens" if self.has_tokens else "text"
        return f"{type(self).__name__}({str(self.path)!r}, n={len(self)}, target_dim={self.target_dim}, {kind})"


class _TokenStats:
    """Running token-id statistics of the index pass."""

    def __init__(self) -> None:
        self.lengths = array("i")
        self.max_token_id = -1
        self.max_token_record = -1
        self.unmasked_tokens = 0

    def add(self, ids_max: int, length: int, unmasked: int) -> None:
        if ids_max > self.max_token_id:
            self.max_token_id = ids_max
            self.max_token_record = len(self.lengths)
        self.lengths.append(length)
        self.unmasked_tokens += unmasked

    def store_on(self, source: SampleSource) -> None:
        source.max_token_id = self.max_token_id
        source.max_token_record = self.max_token_record
        source.unmasked_tokens = self.unmasked_tokens
        source.token_lengths = np.frombuffer(self.lengths, dtype=np.int32) if source.has_tokens else None


_NUMBER_TYPES = frozenset((float, int))  # exact types: bool is an int subclass and not a number here


def _all_numbers(values: list) -> bool:
    return set(map(type, values)) <= _NUMBER_TYPES  # one C-level pass: a job validates ~10^6 values at start


def _all_finite(values: list) -> bool:
    try:
        return bool(np.isfinite(np.array(values, dtype=np.float64)).all())
    except OverflowError:  # an integer too large for a float
        return False


class JsonlSource(SampleSource):
    """JSONL in text or token mode (decided by the first record; every record must then agree)."""

    def __init__(self, path: Path):
        super().__init__(path)
        starts = array("q")
        line_numbers = array("q")
        stats = _TokenStats()
        self.has_tokens = False
        self.has_text = True
        self.target_dim = 0
        offset = 0
        with open(path, "rb") as f:
            for line_number, raw in enumerate(f, start=1):
                if raw.strip():
                    where = f"{path}:line {line_number}"
                    record = self._parse(raw, where)
                    if not starts:
                        self._set_layout(record, where)
                    self._validate(record, where, stats)
                    starts.append(offset)
                    line_numbers.append(line_number)
                offset += len(raw)
        if not starts:
            raise DataFormatError(f"{path}:line 1: no records (the file holds only blank lines)")
        self._starts = np.frombuffer(starts, dtype=np.int64)
        self._ends = np.append(self._starts[1:], offset)  # blank lines in between are harmless to json.loads
        self._line_numbers = np.frombuffer(line_numbers, dtype=np.int64)
        stats.store_on(self)

    def __len__(self) -> int:
        return len(self._starts)

    def locate(self, index: int) -> str:
        return f"{self.path}:line {int(self._line_numbers[index])}"

    @staticmethod
    def _parse(raw: bytes, where: str) -> dict:
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise DataFormatError(f"{where}: not valid UTF-8 (byte {e.start} of the line)") from None
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataFormatError(f"{where}: invalid JSON ({e.msg} at column {e.colno})") from None
        if not isinstance(record, dict):
            raise DataFormatError(f"{where}: expected a JSON object, got {type(record).__name__}")
        return record

    def _set_layout(self, first: dict, where: str) -> None:
        self.has_tokens = "input_ids" in first or "attention_mask" in first
        target = first.get("target")
        if isinstance(target, list):
            if not target:
                raise DataFormatError(f"{where}: 'target' is empty")
            self.target_dim = len(target)

    def _validate(self, record: dict, where: str, stats: _TokenStats) -> None:
        if "target" not in record:
            raise DataFormatError(f"{where}: missing 'target'")
        target = record["target"]
        if not isinstance(target, list) or not _all_numbers(target):
            raise DataFormatError(f"{where}: 'target' must be a list of numbers")
        if len(target) != self.target_dim:
            raise DataFormatError(f"{where}: 'target' has {len(target)} values, the first record has {self.target_dim}")
        if not _all_finite(target):
            raise DataFormatError(f"{where}: 'target' contains NaN or Inf")

        text = record.get("text")
        if text is None:
            if not self.has_tokens:
                raise DataFormatError(f"{where}: missing 'text' (text-mode JSONL needs text and target)")
            self.has_text = False
        elif not isinstance(text, str):
            raise DataFormatError(f"{where}: 'text' must be a string, got {type(text).__name__}")

        if not self.has_tokens:
            if "input_ids" in record or "attention_mask" in record:
                raise DataFormatError(f"{where}: has token fields but the first record is text mode (no input_ids)")
            return
        for key in ("input_ids", "attention_mask"):
            if key not in record:
                raise DataFormatError(f"{where}: missing '{key}' (the first record is token mode)")
        ids, mask = record["input_ids"], record["attention_mask"]
        if not isinstance(ids, list) or not all(type(v) is int for v in ids):
            raise DataFormatError(f"{where}: 'input_ids' must be a list of integers")
        if not isinstance(mask, list) or not all(type(v) is int for v in mask):
            raise DataFormatError(f"{where}: 'attention_mask' must be a list of integers 0/1")
        if len(ids) != len(mask):
            raise DataFormatError(f"{where}: 'input_ids' has {len(ids)} tokens but 'attention_mask' has {len(mask)}")
        if any(v != 0 and v != 1 for v in mask):
            raise DataFormatError(f"{where}: 'attention_mask' values must be 0 or 1")
        if ids and min(ids) < 0:
            raise DataFormatError(f"{where}: 'input_ids' contains a negative id ({min(ids)})")
        stats.add(max(ids) if ids else -1, len(ids), sum(mask))

    def _read(self, index: int) -> Sample:
        start = int(self._starts[index])
        record = json.loads(self._read_at(start, int(self._ends[index]) - start))
        sample = Sample(target=np.asarray(record["target"], dtype=np.float32), text=record.get("text"))
        if self.has_tokens:
            sample.input_ids = np.asarray(record["input_ids"], dtype=np.int64)
            sample.attention_mask = np.asarray(record["attention_mask"], dtype=np.uint8)
        return sample


class Efb1Source(SampleSource):
    """EFB1 binary records (tokens and targets, no text)."""

    def __init__(self, path: Path):
        super().__init__(path)
        self.has_tokens = True
        self.has_text = False
        file_size = path.stat().st_size
        stats = _TokenStats()
        starts = array("q")
        with open(path, "rb") as f:
            header = f.read(_EFB1_HEADER.size)
            if header[:4] != EFB1_MAGIC:
                raise DataFormatError(
                    f"{path}:record 0: bad magic {header[:4]!r}, expected {EFB1_MAGIC!r} (not an EFB1 file)"
                )
            if len(header) < _EFB1_HEADER.size:
                raise DataFormatError(f"{path}:record 0: truncated header ({len(header)} of {_EFB1_HEADER.size} bytes)")
            _, num_samples, embed_dim = _EFB1_HEADER.unpack(header)
            if embed_dim == 0 and num_samples > 0:
                raise DataFormatError(f"{path}:record 0: header says embed_dim 0")
            self.target_dim = embed_dim
            offset = _EFB1_HEADER.size
            while offset < file_size:
                where = f"{path}:record {len(starts)}"
                if len(starts) >= num_samples:
                    raise DataFormatError(
                        f"{where}: header says {num_samples} samples but {file_size - offset} more bytes follow"
                    )
                length_bytes = f.read(_U32.size)
                if len(length_bytes) < _U32.size:
                    raise DataFormatError(f"{where}: truncated record (file ends inside the length field)")
                (length,) = _U32.unpack(length_bytes)
                body_size = length * 5 + embed_dim * 4
                if offset + _U32.size + body_size > file_size:  # checked before reading: a corrupt L may be huge
                    raise DataFormatError(
                        f"{where}: truncated record ({length} tokens need {body_size} bytes, "
                        f"{file_size - offset - _U32.size} left)"
                    )
                body = f.read(body_size)
                ids = np.frombuffer(body, dtype="<u4", count=length)
                mask = np.frombuffer(body, dtype=np.uint8, count=length, offset=length * 4)
                target = np.frombuffer(body, dtype="<f4", count=embed_dim, offset=length * 5)
                if length and mask.max() > 1:
                    raise DataFormatError(f"{where}: attention_mask values must be 0 or 1")
                if not np.isfinite(target).all():
                    raise DataFormatError(f"{where}: target contains NaN or Inf")
                stats.add(int(ids.max()) if length else -1, length, int(mask.sum(dtype=np.int64)))
                starts.append(offset)
                offset += _U32.size + body_size
        if len(starts) != num_samples:
            raise DataFormatError(
                f"{path}:record {len(starts)}: header says {num_samples} samples, the file holds {len(starts)}"
            )
        if num_samples == 0:
            raise DataFormatError(f"{path}:record 0: no records")
        self._starts = np.frombuffer(starts, dtype=np.int64)
        stats.store_on(self)

    def __len__(self) -> int:
        return len(self._starts)

    def locate(self, index: int) -> str:
        return f"{self.path}:record {index}"

    def _read(self, index: int) -> Sample:
        start = int(self._starts[index])
        (length,) = _U32.unpack(self._read_at(start, _U32.size))
        body = self._read_at(start + _U32.size, length * 5 + self.target_dim * 4)
        return Sample(
            target=np.frombuffer(body, dtype="<f4", count=self.target_dim, offset=length * 5).astype(np.float32),
            input_ids=np.frombuffer(body, dtype="<u4", count=length).astype(np.int64),
            attention_mask=np.frombuffer(body, dtype=np.uint8, count=length, offset=length * 4).copy(),
        )


def resolve_data_file(path: str | os.PathLike) -> Path:
    """The data file that `path` names: the file itself, or for a directory the one its manifest or content picks."""
    path = Path(path)
    if not path.exists():
        raise DataFormatError(f"{path}: no such file or directory")
    if not path.is_dir():
        return path
    manifest_path = path / MANIFEST_NAME
    if manifest_path.is_file():
        files = manifest_files(manifest_path)
        for key in FORMAT_PREFERENCE:
            if key in files and (path / files[key]).is_file():
                return path / files[key]
        raise DataFormatError(
            f"{manifest_path}:line 1: none of the data files it names exist; re-run prepare with --force"
        )
    candidates = sorted(p for p in path.iterdir() if p.is_file() and p.suffix in DATA_SUFFIXES)
    if len(candidates) != 1:
        found = ", ".join(p.name for p in candidates) or "none"
        raise DataFormatError(
            f"{path}: a data directory needs a {MANIFEST_NAME} or exactly one .jsonl/.efb1 file (found: {found})"
        )
    return candidates[0]


def manifest_files(manifest_path: Path) -> dict[str, str]:
    """The manifest's "files": {format key: file name}, each name a file inside the manifest's own directory.

    A name that is absolute or climbs out with ".." is refused, not followed: a data directory is what its manifest
    describes, and one copied or unpacked from elsewhere must not make a job read (or train on) an unrelated file.
    """
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise DataFormatError(f"{manifest_path}:line 1: not valid UTF-8 (byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise DataFormatError(f"{manifest_path}:line {e.lineno}: not a prepare.py manifest ({e.msg})") from None
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
        raise DataFormatError(
            f"{manifest_path}:line 1: not a prepare.py manifest (expected an object whose \"files\" maps format "
            f"names to file names, e.g. {{\"files\": {{\"efb1\": \"demo.efb1\"}}}})"
        )
    for key, name in files.items():
        parts = PurePath(name).parts
        if not parts or PurePath(name).is_absolute() or ".." in parts:
            raise DataFormatError(
                f"{manifest_path}:line 1: files.{key}={name!r} is not a file inside {manifest_path.parent}; "
                "a manifest names files beside it"
            )
    return files


def open_dataset(path: str | os.PathLike) -> SampleSource:
    """Validate and index a JSONL or EFB1 file (or a directory holding one) for lazy random access."""
    file_path = resolve_data_file(path)
    with open(file_path, "rb") as f:
        head = f.read(len(EFB1_MAGIC))
    if not head:
        raise DataFormatError(f"{file_path}:line 1: empty file")
    if head == EFB1_MAGIC or file_path.suffix == ".efb1":
        return Efb1Source(file_path)
    if file_path.suffix == ".jsonl":
        return JsonlSource(file_path)
    raise DataFormatError(f"{file_path}:line 1: unknown format (expected a .jsonl file or an EFB1 file)")


__all__ = [
    "DataFormatError",
    "Sample",
    "SampleSource",
    "JsonlSource",
    "Efb1Source",
    "open_dataset",
    "resolve_data_file",
    "write_jsonl",
    "write_efb1",
    "EFB1_MAGIC",
    "MANIFEST_NAME",
    "FORMAT_PREFERENCE",
]


def token_rows(path: Path, max_rows: int) -> list[np.ndarray]:
    """The real (unpadded) token ids of a dataset's first `max_rows` samples; text-mode data is tokenized with the
    tokenizer.json beside it. Empty samples are left out. For the export's checks on real data."""
    source = open_dataset(path)
    rows: list[np.ndarray] = []
    tokenizer = None
    for index in range(min(len(source), max_rows)):
        sample = source[index]
        if sample.input_ids is not None:
            rows.append(sample.input_ids[sample.attention_mask.astype(bool)])
            continue
        if tokenizer is None:
            tokenizer_path = resolve_data_file(path).parent / "tokenizer.json"
            if not tokenizer_path.is_file():
                raise DataFormatError("text-mode data needs a tokenizer.json beside it")
            tokenizer = TextTokenizer.load(tokenizer_path)
        ids, masks, _ = tokenizer.encode([sample.text], 1 << 20)
        rows.append(np.asarray(ids[0])[np.asarray(masks[0], dtype=bool)])
    return [row for row in rows if len(row)]


def export_rows(path: Path, vocab_size: int, seq_len: int, max_rows: int) -> list[np.ndarray]:
    """`ExportSpec.real_rows`: the token rows of a dataset file (every id is checked against the vocabulary later)."""
    return token_rows(path, max_rows)
