"""A call run in a fresh Python process, so that a crash of the callee is a result rather than the end of the caller.

Core ML prediction needs it: a package loaded with `CPU_AND_NE` can load although the Neural Engine compiler failed on
it, and the first `predict` then kills the process (coremltools#2758). The export runs that prediction here
(`verify.on_device`) and reports such a death as a failed check instead of dying with it.
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

# the child: import the target, call it with the pickled arguments, pickle what it returns
_BOOT = """
import importlib, pickle, sys
module, _, name = sys.argv[1].partition(":")
with open(sys.argv[2], "rb") as f:
    args = pickle.load(f)
result = getattr(importlib.import_module(module), name)(*args)
with open(sys.argv[3], "wb") as f:
    pickle.dump(result, f)
"""


class ChildFailed(RuntimeError):
    """The child died (a signal), raised, or ran out of time; the message says which, in one line."""


def in_child(target: str, *args, timeout: float = 900.0):
    """`module:function(*args)` in a fresh Python process (this interpreter, this process's import path); its return
    value. Arguments and result travel pickled through files in a temporary directory."""
    with tempfile.TemporaryDirectory(prefix="sweeplab-child-") as scratch:
        args_file, result_file = Path(scratch) / "args.pkl", Path(scratch) / "result.pkl"
        args_file.write_bytes(pickle.dumps(args))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        try:
            done = subprocess.run([sys.executable, "-c", _BOOT, target, str(args_file), str(result_file)], env=env,
                                  capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise ChildFailed(f"{target} did not finish in {timeout:g} s") from None
        if done.returncode < 0:
            raise ChildFailed(f"{target} was killed by {signal.Signals(-done.returncode).name}")
        if done.returncode != 0 or not result_file.exists():
            last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
            raise ChildFailed(f"{target} failed: {last[:300]}")
        return pickle.loads(result_file.read_bytes())
