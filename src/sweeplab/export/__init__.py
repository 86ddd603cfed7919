"""Core ML export: a trained TextBridge or paGating LM as an .mlpackage for the Apple Neural Engine, verified on Linux.

- `pipeline`: the stage (`export_checkpoint`, `export_after_training`, `checkpoint_from_run`);
- `options`: the `export` config group (`ExportOptions`);
- `ane`: the Neural-Engine layout wrappers (`to_ane_layout`);
- `convert`: tracing, conversion, compression, metadata; `ct_fixes`: coremltools 9.0 converter fixes;
- `reference`: the Linux reference evaluator (`load_program(path).run(inputs)`);
- `verify`: inputs, error measures, trained-weight check, macOS prediction and placement; `report`: JSON + Markdown;
- `readiness`: the ANE readiness report (ops known to leave the Neural Engine, fp16 range, fp16 against fp32).
"""

from __future__ import annotations

import importlib

# Imported on first use (PEP 562): `python -m sweeplab.export` checks its overrides before torch and coremltools
# load (seconds), and `import sweeplab.export` stays light for the engine's plan.
_WHERE = {
    "ExportOptions": "options",
    "ExportResult": "pipeline",
    "ReferenceProgram": "reference",
    "checkpoint_from_run": "pipeline",
    "export_after_training": "pipeline",
    "export_checkpoint": "pipeline",
    "load_program": "reference",
    "options_from_config": "pipeline",
    "to_ane_layout": "ane",
}


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(importlib.import_module(f"sweeplab.export.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'sweeplab.export' has no attribute {name!r}")


__all__ = [
    "ExportOptions",
    "ExportResult",
    "ReferenceProgram",
    "checkpoint_from_run",
    "export_after_training",
    "export_checkpoint",
    "load_program",
    "options_from_config",
    "to_ane_layout",
]
