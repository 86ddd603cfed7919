"""TextBridge's data for the bench (`Family.bench_data`): the demo set tiled to more records than it holds, for
batches larger than the demo set allows (`bench.data_samples`)."""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sweeplab.families.textbridge.formats import open_dataset, write_efb1
from sweeplab.families.textbridge.prepare import prepare_textbridge_demo, read_manifest


def tiled_textbridge_data(demo_dir: Path, out_dir: Path, n_samples: int) -> Path:
    """The demo set's records repeated to `n_samples` (an EFB1 file with the demo tokenizer beside it)."""
    if read_manifest(demo_dir) is None:
        prepare_textbridge_demo(demo_dir)
    target = out_dir / f"textbridge_tiled_{n_samples}" / "data.efb1"
    if target.exists():
        return target.parent
    source = open_dataset(demo_dir / "demo.efb1")
    target.parent.mkdir(parents=True, exist_ok=True)
    write_efb1(target, (source[i % len(source)] for i in range(n_samples)))
    source.close()
    if (demo_dir / "tokenizer.json").exists():
        shutil.copy(demo_dir / "tokenizer.json", target.parent / "tokenizer.json")
    return target.parent


def bench_data(data: Mapping[str, Any], n_samples: int, out_dir: Path) -> dict[str, Any]:
    """The `data` keys a bench row sets: a row on the demo set (no `data.path`) trains on the demo tiled to
    `n_samples` records; a row with its own data keeps it."""
    if data.get("path") is not None:
        return {}
    return {"path": str(tiled_textbridge_data(Path(data["demo_dir"]), out_dir, n_samples))}
