"""Core ML export: a trained TextBridge or paGating LM as an .mlpackage for the Apple Neural Engine, verified on Linux.

- `pipeline`: the stage (`export_checkpoint`, `export_after_training`, `checkpoint_from_run`);
- `options`: the `export` config group (`ExportOptions`);
- `ane`: the Neural-Engine layout wrappers (`to_ane_layout`);
- `convert`: tracing, conversion, compression, metadata; `ct_fixes`: coremltools 9.0 converter fixes;
- `reference`: the Linux reference evaluator (`load_program(path).run(inputs)`);
- `verify`: inputs, error measures, trained-weight check, macOS prediction and placement; `report`: JSON + Markdown;
- `readiness`: the ANE readiness report (ops known to leave the Neural Engine, fp16 range, fp16 against fp32).
"""

from sweeplab.export.ane import to_ane_layout
from sweeplab.export.options import ExportOptions
from sweeplab.export.pipeline import (
    ExportResult,
    checkpoint_from_run,
    export_after_training,
    export_checkpoint,
    options_from_config,
)
from sweeplab.export.reference import ReferenceProgram, load_program

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
