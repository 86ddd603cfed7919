"""The offline corpora: text that ships with CPython, under the PSF licence (the Python Software Foundation License).

- `reference` (the default): the Python language reference (`pydoc_data.topics`).
- `stdlib` (opt-in, TextBridge only): the reference's sentences followed by the docstrings of the standard library's
  modules, classes and functions, read from the source files with `ast` (never imported).

Nothing here downloads. Both model families start from this text: TextBridge takes sentences, the LM takes the
raw reference text split by topic into train/valid/test.
"""

from __future__ import annotations

import ast
import functools
import os
import platform
import re
import sysconfig
import warnings
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

_WS = re.compile(r"\s+")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"'(])")
_RULE = re.compile(r"^[*=\-~^]{3,}$")


def demo_topics() -> dict[str, str]:
    """Topic name -> raw text, sorted by name (stable across runs of one CPython version)."""
    from pydoc_data.topics import topics

    return {name: topics[name] for name in sorted(topics)}


def _prose_paragraphs(text: str) -> list[str]:
    """Paragraphs of prose: drops indented code/grammar blocks and heading underlines."""
    paragraphs, current = [], []
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or line.startswith((" ", "\t")) or _RULE.match(stripped):
            if current:
                paragraphs.append(" ".join(current))
                current = []
            continue
        current.append(stripped)
    if current:
        paragraphs.append(" ".join(current))
    return paragraphs


def _add_sentences(paragraphs: Iterable[str], seen: set[str], out: list[str], min_words: int, max_words: int) -> None:
    """Append the paragraphs' sentences of `min_words` to `max_words` words not in `seen` (and add them to it)."""
    for paragraph in paragraphs:
        for sentence in _SENTENCE_END.split(paragraph):
            sentence = _WS.sub(" ", sentence).strip()
            n_words = len(sentence.split())
            if min_words <= n_words <= max_words and sentence not in seen:
                seen.add(sentence)
                out.append(sentence)


def demo_sentences(min_words: int = 4, max_words: int = 60) -> list[str]:
    """Deduplicated prose sentences of the language reference, in a fixed order."""
    seen: set[str] = set()
    sentences: list[str] = []
    for text in demo_topics().values():
        _add_sentences(_prose_paragraphs(text), seen, sentences, min_words, max_words)
    return sentences


# Directories of the standard library that are not its documented modules: other packages (site-packages), test
# suites (their docstrings describe test cases, and lib2to3's test data holds deliberately broken files), IDLE's
# sources (an application, not a library) and bytecode caches.
SKIPPED_DIRS = frozenset({"site-packages", "dist-packages", "test", "tests", "idle_test", "idlelib", "__pycache__"})
_DOCTEST = re.compile(r"^(>>>|\.\.\.)( |$)")
# reST tables: grid borders (+---+---+), rows (| a | b |) and simple-table borders (=====  =====)
_TABLE = re.compile(r"^(\+[-=+]+\+|\|.*\||=+( +=+)+|-+( +-+)+)$")
# Code-ish lines, cut out of their paragraph as indented code is: signatures (`copy(x) -> y`), comments, statements.
_CODE_LINE = re.compile(
    r"^([\w.]+\(.*\)(\s*->.*)?|#.*|(def|class|import|return|raise|print|assert|from \S+ import)\b.*"
    r"|(if|elif|else|for|while|with|try|except)\b.*:)$"
)
_BULLET = re.compile(r"^[-*+] ")


@dataclass(frozen=True)
class DocstringReading:
    """What `read_docstrings` found: sentences in a fixed order and an account of the files read."""

    sentences: tuple[str, ...]
    files: int  # .py files parsed
    modules: int  # files that gave at least one sentence
    skipped: tuple[str, ...]  # files that could not be read, decoded or parsed (relative paths)


def _docstring_paragraphs(text: str) -> list[str]:
    """The prose paragraphs of a docstring.

    Beyond the reference's rules (`_prose_paragraphs`): a block (lines between blank lines) holding a doctest prompt
    or a table row is left out whole, a code-ish line is cut out like an indented one, and each bullet item is a
    paragraph of its own.
    """
    lines: list[str] = []
    for block in re.split(r"\n[ \t]*\n", text):
        block_lines = block.splitlines()
        if any(_DOCTEST.match(line.strip()) or _TABLE.match(line.strip()) for line in block_lines):
            continue
        for line in block_lines:
            if _BULLET.match(line):
                lines.append("")
            lines.append("" if _CODE_LINE.match(_BULLET.sub("", line)) else line)
        lines.append("")
    return _prose_paragraphs("\n".join(lines))


def _docstrings(tree: ast.Module) -> list[str]:
    """The module's, its classes' and its functions' docstrings (nested ones too), in source order."""
    nodes = [n for n in ast.walk(tree) if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]
    nodes.sort(key=lambda n: (n.lineno, n.col_offset))
    texts = [ast.get_docstring(node) for node in [tree, *nodes]]
    return [text for text in texts if text]


def _source_files(root: Path) -> list[Path]:
    """The .py files under `root`, SKIPPED_DIRS pruned, sorted by their relative path."""
    files = []
    for directory, subdirs, names in os.walk(root):
        subdirs[:] = [d for d in subdirs if d not in SKIPPED_DIRS]
        files.extend(Path(directory, name) for name in names if name.endswith(".py"))
    return sorted(files, key=lambda path: path.relative_to(root).parts)


def read_docstrings(
    root: str | os.PathLike, known: Iterable[str] = (), min_words: int = 4, max_words: int = 60
) -> DocstringReading:
    """Docstring sentences of the .py files under `root`, parsed with `ast` (never imported), not in `known`.

    The reference's rules (prose paragraphs only, `min_words` to `max_words` words, deduplicated) plus those of
    `_docstring_paragraphs` (doctest and table blocks, code-ish lines left out). A file that cannot be read, decoded or parsed is skipped and
    counted.
    """
    root = Path(root)
    seen = set(known)
    sentences: list[str] = []
    skipped: list[str] = []
    n_files = n_modules = 0
    for path in _source_files(root):
        try:
            with warnings.catch_warnings():  # invalid escapes in old sources: not ours to report
                warnings.simplefilter("ignore")
                tree = ast.parse(path.read_bytes(), filename=str(path))
        except (OSError, SyntaxError, ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
            skipped.append(path.relative_to(root).as_posix())
            continue
        n_files += 1
        before = len(sentences)
        for text in _docstrings(tree):
            _add_sentences(_docstring_paragraphs(text), seen, sentences, min_words, max_words)
        n_modules += len(sentences) > before
    return DocstringReading(tuple(sentences), n_files, n_modules, tuple(skipped))


@functools.lru_cache(maxsize=1)
def stdlib_docstrings() -> DocstringReading:
    """`read_docstrings` of this Python's standard library (`sysconfig`'s stdlib path), less the reference's."""
    return read_docstrings(sysconfig.get_path("stdlib"), known=demo_sentences())


CORPORA = ("reference", "stdlib")


def corpus_sentences(name: str = "reference") -> list[str]:
    """The sentences of a corpus (see CORPORA), in a fixed order; `stdlib` starts with all of `reference`'s."""
    if name not in CORPORA:
        raise ValueError(f"corpus {name!r} is not one of {CORPORA}")
    sentences = demo_sentences()
    if name == "stdlib":
        sentences += stdlib_docstrings().sentences
    return sentences


def corpus_record(name: str) -> dict:
    """A manifest's account of a corpus: what it is, its licence, and how many sentences came from where."""
    record = {
        "name": name,
        "licence": "PSF-2.0 (the Python Software Foundation License; the text ships with CPython)",
        "python": platform.python_version(),
        "reference_sentences": len(demo_sentences()),
    }
    if name == "stdlib":
        reading = stdlib_docstrings()
        record.update(
            docstring_sentences=len(reading.sentences),
            docstring_files=reading.files,
            docstring_modules=reading.modules,
            skipped_files=list(reading.skipped),
        )
    return record


def demo_lm_splits(valid_every: int = 10) -> dict[str, str]:
    """train/valid/test raw text: every topic goes wholly to one split, chosen by a hash of its name."""
    splits: dict[str, list[str]] = {"train": [], "valid": [], "test": []}
    for name, text in demo_topics().items():
        bucket = zlib.crc32(name.encode()) % valid_every
        split = "valid" if bucket == 0 else "test" if bucket == 1 else "train"
        splits[split].append(text)
    return {split: "\n\n".join(texts) for split, texts in splits.items()}
