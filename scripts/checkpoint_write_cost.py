"""What writing a paGating-small `last.ckpt` costs (issue 36): its checksum one stream against per tensor on threads,
torch.save with the fsync, and sweeplab's whole background write, side by side in one process, alternating, median
of the repeats.

    python scripts/checkpoint_write_cost.py [--repeats 3] [--dir /tmp]

The checkpoint holds GPT small's weights (vocabulary 50,304) and AdamW's two states, ~1.5 GB, on the CPU (what the
writer thread gets: the training thread's snapshot).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from sweeplab.models.gpt import GPT, GPTConfig
from sweeplab.tasks import checkpoint


def pagating_small_checkpoint() -> dict:
    model = GPT(GPTConfig(vocab_size=50304, block_size=1024, n_layer=12, n_head=12, d_model=768, d_ff=3072))
    state = {i: {"step": torch.tensor(300.0), "exp_avg": p.detach().clone(), "exp_avg_sq": p.detach().clone()}
             for i, p in enumerate(model.parameters())}
    return {"state_dict": model.state_dict(), "optimizer_states": [{"state": state, "param_groups": []}],
            "global_step": 300, "hyper_parameters": {"family": "pagating_lm"}}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", default=tempfile.gettempdir())
    args = parser.parse_args(argv)
    ckpt = pagating_small_checkpoint()
    size = sum(t.numel() * t.element_size() for t in {t.data_ptr(): t for t in _tensors(ckpt)}.values())
    target = Path(args.dir) / "checkpoint-write-cost.ckpt"

    def save_file_object() -> None:
        with open(target, "wb") as f:
            torch.save(ckpt, f)
            f.flush()
            os.fsync(f.fileno())

    rows = {
        "checksum, sha256 one stream (before)": lambda: checkpoint.content_checksum(ckpt, checkpoint.LINEAR_ALGORITHM),
        "checksum, sha256 per tensor on threads (now)": lambda: checkpoint.content_checksum(ckpt),
        "torch.save + fsync": save_file_object,
        "sweeplab's write (checksum, save, fsync, rename)": lambda: checkpoint._write(ckpt, target),
    }
    times: dict[str, list[float]] = {name: [] for name in rows}
    for _ in range(args.repeats):
        for name, run in rows.items():
            started = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - started)
    target.unlink(missing_ok=True)
    print(f"{size / 1e9:.2f} GB of tensors, {len(os.sched_getaffinity(0))} cores, {args.repeats} repeats, "
          f"into {args.dir}")
    print("| step | median s | repeats s |\n|---|---|---|")
    for name, seconds in times.items():
        print(f"| {name} | {statistics.median(seconds):.3f} | {' '.join(f'{s:.3f}' for s in seconds)} |")


def _tensors(value):
    if torch.is_tensor(value):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)


if __name__ == "__main__":
    main()
