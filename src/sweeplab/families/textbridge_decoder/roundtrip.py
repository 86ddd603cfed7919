"""The round trip: text -> TextBridge encoder -> cube -> decoder -> text, scored against the text it started from.

    python -m sweeplab.families.textbridge_decoder.roundtrip --encoder ENC.ckpt --decoder DEC.ckpt
        [--data data/textbridge_demo] [--split val|train|all] [--limit N] [--teacher auto|none] [--out FILE.json]

Both checkpoints must come from the same data (one tokenizer, one teacher: the encoder's output size is the
decoder's embedding size). The sentences are the data's held-out split (the seeded split training used, with
`--seed` and `--val-fraction` as in training). Two decodes are scored, each by exact match on token ids and chrF on
lowercased text: from the teacher's embedding (what the decoder was trained on: its upper bound) and from the
encoder's cube (the round trip). With a real teacher (the data's manifest names all-MiniLM-L6-v2; `--teacher auto`)
the teacher also embeds the original and the reconstructed sentences and their cosine is reported; the seeded
random teacher's cosine would say nothing about meaning, so it is not computed for such data.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from sweeplab.core.errors import UserError, exit_on_user_error
from sweeplab.core.files import write_text_atomic
from sweeplab.families.textbridge_decoder.task import chrf

BATCH = 64


@dataclass
class RoundTrip:
    """Scores ({name: value}) and the sentences behind them (original, from the teacher's embedding, from the cube)."""

    metrics: dict[str, float] = field(default_factory=dict)
    originals: list[str] = field(default_factory=list)
    from_teacher: list[str] = field(default_factory=list)
    from_cube: list[str] = field(default_factory=list)


def encode(encoder, tokenizer, texts: list[str]) -> torch.Tensor:
    """Texts -> (N, out_dim) cubes with a TextBridge encoder (tokens cut at its max_len, as in training)."""
    return encode_ids(encoder, tokenizer.pad_id, tokenizer.encode(texts, encoder.config.max_len)[0])


@torch.no_grad()
def encode_ids(encoder, pad_id: int, token_rows: list[list[int]]) -> torch.Tensor:
    """Token id rows -> (N, out_dim) cubes (each row cut at the encoder's max_len)."""
    cubes = []
    for start in range(0, len(token_rows), BATCH):
        rows = [list(row)[: encoder.config.max_len] for row in token_rows[start : start + BATCH]]
        width = max(1, max(len(row) for row in rows))
        ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for r, row in enumerate(rows):
            ids[r, : len(row)] = torch.tensor(row, dtype=torch.long)
            mask[r, : len(row)] = 1
        cubes.append(encoder(ids, mask))
    return torch.cat(cubes)


def decode(decoder, embeddings: torch.Tensor) -> list[list[int]]:
    """Greedy decodes of (N, E) embeddings, in batches."""
    return [row for start in range(0, len(embeddings), BATCH) for row in decoder.generate(embeddings[start : start + BATCH])]


def scores(prefix: str, hypotheses: list[list[int]], references: list[list[int]], tokenizer) -> dict[str, float]:
    exact = float(np.mean([h == r for h, r in zip(hypotheses, references)])) if references else 0.0
    return {f"{prefix}/exact_match": exact, f"{prefix}/chrf": chrf(tokenizer.decode(hypotheses), tokenizer.decode(references))}


def teacher_cosine(teacher, originals: list[str], reconstructed: list[str]) -> float:
    """Mean cosine, in the teacher's space, between each original sentence and its reconstruction."""
    a = torch.from_numpy(teacher.encode(originals, progress=False))
    b = torch.from_numpy(teacher.encode(reconstructed, progress=False))
    return float(torch.nn.functional.cosine_similarity(a, b, dim=-1).mean())


def round_trip(encoder, decoder, tokenizer, texts: list[str] | None, references: list[list[int]], targets: np.ndarray,
               teacher=None) -> RoundTrip:
    """Score the decoder on `texts` (their token ids `references`, teacher embeddings `targets`): from the teacher's
    embeddings and from the encoder's cubes; the teacher's cosine original/reconstruction when `teacher` is given.
    `texts=None` (data that holds token ids only, an EFB1 file): the encoder reads the token ids themselves."""
    if encoder.config.out_dim != decoder.config.embed_dim:
        raise UserError(f"the encoder writes {encoder.config.out_dim}-d cubes, the decoder reads {decoder.config.embed_dim}-d "
                        "embeddings: train both on the same data")
    cubes = encode(encoder, tokenizer, texts) if texts is not None else encode_ids(encoder, tokenizer.pad_id, references)
    references = [list(r[: decoder.config.max_len]) for r in references]
    teacher_embeddings = torch.from_numpy(np.asarray(targets, dtype=np.float32))
    from_teacher, from_cube = decode(decoder, teacher_embeddings), decode(decoder, cubes)
    result = RoundTrip(originals=tokenizer.decode(references), from_teacher=tokenizer.decode(from_teacher),
                       from_cube=tokenizer.decode(from_cube))
    result.metrics = {
        "sentences": float(len(references)),
        "cube/teacher_cos": float(torch.nn.functional.cosine_similarity(cubes, teacher_embeddings, dim=-1).mean()),
        **scores("from_teacher", from_teacher, references, tokenizer),
        **scores("round_trip", from_cube, references, tokenizer),
    }
    if teacher is not None:
        result.metrics["from_teacher/teacher_cos"] = teacher_cosine(teacher, result.originals, result.from_teacher)
        result.metrics["round_trip/teacher_cos"] = teacher_cosine(teacher, result.originals, result.from_cube)
    return result


def _split(data: Path, split: str, seed: int, val_fraction: float, limit: int | None):
    """(data module, sample indices) of the split training used."""
    from sweeplab.families.textbridge.data import TextBridgeDataModule

    dm = TextBridgeDataModule(path=str(data), seed=seed, val_fraction=val_fraction, max_len=10**6)
    dm.setup()
    if dm.tokenizer is None:
        raise UserError(f"--data {data}: no tokenizer.json beside the data; the round trip reads and writes text")
    indices = {"val": dm.val_dataset.indices, "train": dm.train_dataset.indices,
               "all": np.arange(len(dm.source))}[split]
    return dm, np.asarray(indices)[:limit]


def _teacher(data: Path, choice: str):
    """The data's real teacher (all-MiniLM-L6-v2, per its manifest) for `--teacher auto`; None otherwise."""
    from sweeplab.families.textbridge.prepare import read_manifest
    from sweeplab.families.textbridge.teacher import Teacher

    manifest = read_manifest(data) or {}
    kind = ((manifest.get("settings") or {}).get("teacher") or {}).get("kind")
    if choice == "none" or kind != "minilm":
        return None
    return Teacher.minilm()


def check_arguments(args: argparse.Namespace) -> None:
    """What can be told before anything is loaded: one line each."""
    if args.limit is not None and args.limit < 1:
        raise UserError(f"--limit must be at least 1 (sentences to score), got {args.limit}")
    if not 0 < args.val_fraction < 1:
        raise UserError(f"--val-fraction must be between 0 and 1, got {args.val_fraction}")
    if args.out:
        out = Path(args.out)
        if out.is_dir():
            raise UserError(f"--out {out}: is a folder; name the JSON file to write")
        if not out.parent.is_dir():
            raise UserError(f"--out {out}: the folder {out.parent} does not exist; create it first")
        if not os.access(out.parent, os.W_OK):
            raise UserError(f"--out {out}: the folder {out.parent} is not writable")


def check_data_fits(dm, encoder, decoder, data: Path) -> None:
    """The data is the one both checkpoints were trained on: its embedding size and its token ids fit them."""
    if dm.target_dim != decoder.config.embed_dim:
        raise UserError(f"--data {data}: holds {dm.target_dim}-d teacher embeddings, the decoder reads "
                        f"{decoder.config.embed_dim}-d ones; pass the data both checkpoints were trained on")
    for name, model in (("encoder", encoder), ("decoder", decoder)):
        if dm.vocab_size > model.config.vocab_size:
            raise UserError(f"--data {data}: its tokenizer has {dm.vocab_size} tokens, the {name}'s vocabulary "
                            f"{model.config.vocab_size}; pass the data both checkpoints were trained on")


def run(args: argparse.Namespace) -> RoundTrip:
    from sweeplab.families.loading import load_model

    encoder = load_model(args.encoder, expect_family="textbridge").model
    decoder = load_model(args.decoder, expect_family="textbridge_decoder").model
    dm, indices = _split(Path(args.data), args.split, args.seed, args.val_fraction, args.limit)
    check_data_fits(dm, encoder, decoder, Path(args.data))
    if len(indices) == 0:
        raise UserError(f"--data {args.data}: the {args.split} split holds no sentence")
    samples = [dm.source[int(i)] for i in indices]
    if any(s.input_ids is None for s in samples):
        raise UserError(f"--data {args.data}: the round trip needs token ids (a token-mode JSONL or an EFB1 file, as "
                        "the demo set has)")
    texts = None if any(s.text is None for s in samples) else [s.text for s in samples]
    result = round_trip(encoder, decoder, dm.tokenizer, texts, [s.input_ids.tolist() for s in samples],
                        np.stack([s.target for s in samples]), _teacher(Path(args.data), args.teacher))
    dm.teardown()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sweeplab.families.textbridge_decoder.roundtrip",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--encoder", required=True, help="a TextBridge checkpoint (.ckpt)")
    parser.add_argument("--decoder", required=True, help="a TextBridge decoder checkpoint (.ckpt)")
    parser.add_argument("--data", default="data/textbridge_demo", help="the data both were trained on (default: %(default)s)")
    parser.add_argument("--split", choices=("val", "train", "all"), default="val")
    parser.add_argument("--seed", type=int, default=0, help="the training's seed (the split's)")
    parser.add_argument("--val-fraction", type=float, default=0.1)
    parser.add_argument("--limit", type=int, default=None, help="the first N sentences of the split")
    parser.add_argument("--teacher", choices=("auto", "none"), default="auto",
                        help="auto: the teacher's cosine when the data's teacher is all-MiniLM-L6-v2")
    parser.add_argument("--examples", type=int, default=5, help="sentences to print")
    parser.add_argument("--out", default=None, help="write metrics and sentences as JSON here")
    args = parser.parse_args(argv)
    try:
        check_arguments(args)
        result = run(args)
    except Exception as exc:  # a user error is one line; anything else keeps its traceback
        exit_on_user_error(exc)
    for name, value in result.metrics.items():
        print(f"{name:28s} {value:.4f}")
    for original, teacher, cube in list(zip(result.originals, result.from_teacher, result.from_cube))[: args.examples]:
        print(f"\n  original:     {original}\n  from teacher: {teacher}\n  round trip:   {cube}")
    if args.out:
        rows = [{"original": o, "from_teacher": t, "round_trip": c}
                for o, t, c in zip(result.originals, result.from_teacher, result.from_cube)]
        try:  # whole or not at all
            write_text_atomic(args.out, json.dumps({"metrics": result.metrics, "sentences": rows}, indent=1))
        except Exception as exc:
            exit_on_user_error(exc)
    return 0


if __name__ == "__main__":
    from sweeplab.core.interrupts import exit_on_interrupt

    with exit_on_interrupt("round trip"):
        status = main()
    sys.exit(status)
