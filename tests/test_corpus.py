"""The corpora: the standard library's docstrings read with `ast` on a small tree written here, and the stdlib corpus."""

from __future__ import annotations

from pathlib import Path

import pytest

from sweeplab.data.corpus import corpus_sentences, demo_sentences, read_docstrings

KNOWN = "This sentence is already in the reference corpus."

TREE = {
    "a_mod.py": '''"""The first module explains what it does.

It keeps two sentences in this paragraph. Short one.

>>> this_doctest_is_dropped(1)
This doctest output line is dropped too.

+--------------------+--------------------+
| a table cell here  | is dropped as well |
+--------------------+--------------------+
"""


class Thing:
    """A class docstring with one sentence.

    copy(x, y) -> a signature line is cut out of the paragraph
    This sentence is already in the reference corpus.
    """

    def method(self):
        """The nested method's docstring comes after its class."""


def helper():
    """The first module explains what it does."""
''',
    # never imported: importing it would stop the process
    "boom.py": '"""Only parsing can read this module docstring safely."""\nraise SystemExit("imported")\n',
    "broken.py": '"""A file that does not parse at all."""\ndef (:\n',
    "c_bad_bytes.py": b'"""Undecodable bytes \xff\xfe make this file skipped."""\n',
    "pkg/__init__.py": '"""The package docstring comes last of all."""\n',
    "pkg/tests/test_pkg.py": '"""Test suites are never read by the corpus."""\n',
    "site-packages/other.py": '"""Other packages are never read by the corpus."""\n',
}

EXPECTED = [
    "The first module explains what it does.",
    "It keeps two sentences in this paragraph.",
    "A class docstring with one sentence.",
    "The nested method's docstring comes after its class.",
    "Only parsing can read this module docstring safely.",
    "The package docstring comes last of all.",
]


def write_tree(root: Path, names: list[str]) -> None:
    for name in names:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        content = TREE[name]
        path.write_bytes(content if isinstance(content, bytes) else content.encode())


def test_docstrings_are_parsed_never_imported_with_the_corpus_rules(tmp_path):
    write_tree(tmp_path, list(TREE))
    reading = read_docstrings(tmp_path, known=[KNOWN])
    assert list(reading.sentences) == EXPECTED
    assert reading.skipped == ("broken.py", "c_bad_bytes.py")
    assert (reading.files, reading.modules) == (3, 3)  # a_mod, boom, pkg/__init__; tests and site-packages unread


def test_docstring_order_does_not_depend_on_creation_order(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    write_tree(first, list(TREE))
    write_tree(second, list(reversed(TREE)))
    assert read_docstrings(first) == read_docstrings(second)
    assert KNOWN in read_docstrings(first).sentences  # without `known` it is kept


def test_stdlib_corpus_is_the_reference_then_new_docstring_sentences():
    reference = demo_sentences()
    stdlib = corpus_sentences("stdlib")
    assert corpus_sentences("reference") == reference
    assert stdlib[: len(reference)] == reference
    assert len(stdlib) > 5 * len(reference)
    assert len(set(stdlib)) == len(stdlib)  # deduplicated, against the reference too
    assert not any(">>> " in s for s in stdlib[len(reference) :])  # doctests left out (the reference holds one)
    with pytest.raises(ValueError, match="corpus 'wiki' is not one of"):
        corpus_sentences("wiki")
