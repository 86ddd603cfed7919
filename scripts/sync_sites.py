"""Where the host waits for the GPU during a bench row: every synchronising CUDA call (torch.cuda.set_sync_debug_mode)
counted by its call site, for sweeplab's job and the raw loop alike. Run by hand on a CUDA machine:

    python scripts/sync_sites.py experiment=bench_h100_speed "bench.only=bs32 fp32 compiled CUDA graph" bench.repeats=1

A site whose count is the number of batches is a per-batch wait (a pipeline bubble on a host-bound row)."""
import sys
import traceback
import warnings

import torch

seen = {}


def record(message, category, filename, lineno, file=None, line=None):
    if "synchroniz" not in str(message):
        return
    stack = [f for f in traceback.extract_stack()[:-1] if "/sweeplab/" in f.filename or "/lightning/" in f.filename]
    key = " <- ".join(f"{f.filename.split('/site-packages/')[-1].split('/src/')[-1]}:{f.lineno}" for f in stack[-4:][::-1])
    seen[key] = seen.get(key, 0) + 1


def main(argv: list[str]) -> None:
    warnings.showwarning = record
    warnings.simplefilter("always")
    torch.cuda.set_sync_debug_mode("warn")
    from sweeplab.bench import main as bench  # after the sync debug mode is on, as before

    try:
        bench(argv)
    finally:
        for key, n in sorted(seen.items(), key=lambda kv: -kv[1]):
            print(f"{n:6d}  {key}")


if __name__ == "__main__":
    main(sys.argv[1:])
