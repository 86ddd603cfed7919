"""Started by Python in a test's child process (the test puts this folder on PYTHONPATH): when the child exits, the
names of the modules it imported go to the file SWEEPLAB_TEST_MODULES_AT_EXIT names, so a test can see whether a
refusal came before torch and Lightning were imported."""

import atexit
import os
import sys

_OUT = os.environ.get("SWEEPLAB_TEST_MODULES_AT_EXIT")
if _OUT:
    atexit.register(lambda: open(_OUT, "w").write("\n".join(sorted(sys.modules))))
