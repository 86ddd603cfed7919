"""The offline default corpus: the Python language reference text that ships with CPython (`pydoc_data.topics`).

Nothing here downloads. Both model families start from this text: TextBridge takes sentences, the LM takes the
raw text split by topic into train/valid/test.
"""

from __future__ import annotations

import re
import zlib

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


def demo_sentences(min_words: int = 4, max_words: int = 60) -> list[str]:
    """Deduplicated prose sentences of the language reference, in a fixed order."""
    seen: set[str] = set()
    sentences: list[str] = []
    for text in demo_topics().values():
        for paragraph in _prose_paragraphs(text):
            for sentence in _SENTENCE_END.split(paragraph):
                sentence = _WS.sub(" ", sentence).strip()
                n_words = len(sentence.split())
                if min_words <= n_words <= max_words and sentence not in seen:
                    seen.add(sentence)
                    sentences.append(sentence)
    return sentences


def demo_lm_splits(valid_every: int = 10) -> dict[str, str]:
    """train/valid/test raw text: every topic goes wholly to one split, chosen by a hash of its name."""
    splits: dict[str, list[str]] = {"train": [], "valid": [], "test": []}
    for name, text in demo_topics().items():
        bucket = zlib.crc32(name.encode()) % valid_every
        split = "valid" if bucket == 0 else "test" if bucket == 1 else "train"
        splits[split].append(text)
    return {split: "\n\n".join(texts) for split, texts in splits.items()}
