"""Moved to `sweeplab.families.textbridge.device_batches` (TextBridge's on-device batches are TextBridge's code).

Kept for one release, for `training.plan`, which still resolves `data.pad_to` itself until it asks the family
(`Family.data_values`); import from the family's package.
"""

from sweeplab.families.textbridge.device_batches import *  # noqa: F403
from sweeplab.families.textbridge.device_batches import resolve_pad_to  # noqa: F401  (what training.plan imports)
