"""Conversion: coremltools 9.0 converter fixes (ct_fixes.py), both tracers, and the export options' validation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from sweeplab.core.config import ConfigError
from sweeplab.export.convert import convert
from sweeplab.export.options import ExportOptions
from sweeplab.export.pipeline import options_from_config
from sweeplab.export.reference import load_program
from sweeplab.models.gpt import padding_mask

CONF = __import__("pathlib").Path(__file__).resolve().parents[1] / "conf"


class TanhGelu(torch.nn.Module):
    def forward(self, input_ids, attention_mask):
        x = input_ids.float() / 10 - 2
        return F.gelu(x, approximate="tanh") * attention_mask


class LMMask(torch.nn.Module):
    """The LM's padding mask: torch.eye, `|` and `&` of bool tensors, -1e4 (not -inf) for hidden keys."""

    def forward(self, input_ids, attention_mask):
        return padding_mask(attention_mask, torch.float32).sum(-1) + 0 * input_ids


class ShapeInt(torch.nn.Module):
    """int() of a traced size: what the torch.jit.trace path turns into coremltools' `int` op."""

    def forward(self, input_ids, attention_mask):
        batch, seq = input_ids.shape
        return (input_ids.float() * attention_mask).view(int(batch), int(seq), 1).sum(-1) / seq


def _run(module, tmp_path, tracer="export", seq_len=6, **options):
    converted = convert(module, "out", ExportOptions(precision="fp32", tracer=tracer, **options), seq_len, 40)
    path = tmp_path / f"m{len(list(tmp_path.iterdir()))}.mlpackage"
    converted.mlmodel.save(str(path))
    return converted, load_program(path)


def _inputs(seq_len=6):
    ids = np.arange(seq_len, dtype=np.int32)[None] * 5
    mask = np.ones((1, seq_len), dtype=np.int32)
    mask[0, -2:] = 0
    return ids, mask


def _expected(module, ids, mask):
    with torch.no_grad():
        return module(torch.from_numpy(ids).long(), torch.from_numpy(mask).long()).numpy()


@pytest.mark.parametrize("tracer", ["export", "jit"])
def test_tanh_gelu_stays_tanh(tmp_path, tracer):
    converted, program = _run(TanhGelu(), tmp_path, tracer)
    modes = {op.mode.val for op in program.function.operations if op.op_type == "gelu"}
    assert modes == {"TANH_APPROXIMATION"}
    ids, mask = _inputs()
    out = program.run({"input_ids": ids, "attention_mask": mask})["out"]
    np.testing.assert_allclose(out, _expected(TanhGelu(), ids, mask), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("tracer", ["export", "jit"])
def test_lm_padding_mask_converts_with_finite_values(tmp_path, tracer):
    _, program = _run(LMMask(), tmp_path, tracer)
    assert {"logical_or", "logical_and"} <= set(program.op_types())
    ids, mask = _inputs()
    out = program.run({"input_ids": ids, "attention_mask": mask})["out"]
    np.testing.assert_allclose(out, _expected(LMMask(), ids, mask), rtol=1e-6)
    assert all(np.isfinite(v).all() for v in program.constants().values())


def test_eye_of_an_enumerated_length(tmp_path):
    _, program = _run(LMMask(), tmp_path, seq_lens=[4, 6], seq_len=6, deployment_target="iOS18")
    assert sorted(program.allowed_shapes("input_ids")) == [(1, 4), (1, 6)]
    for seq_len in (4, 6):
        ids, mask = _inputs(seq_len)
        out = program.run({"input_ids": ids, "attention_mask": mask})["out"]
        np.testing.assert_allclose(out, _expected(LMMask(), ids, mask), rtol=1e-6)


def test_int_of_a_shape_on_the_jit_path(tmp_path):
    converted, program = _run(ShapeInt(), tmp_path, tracer="jit")
    assert converted.tracer == "torch.jit.trace"
    ids, mask = _inputs()
    out = program.run({"input_ids": ids, "attention_mask": mask})["out"]
    np.testing.assert_allclose(out, _expected(ShapeInt(), ids, mask), rtol=1e-6)


def test_auto_falls_back_to_jit_trace_and_says_why(tmp_path):
    class NotExportable(TanhGelu):
        def forward(self, input_ids, attention_mask):
            if input_ids.sum() > 0:  # data-dependent control flow: torch.export refuses, jit.trace records one branch
                return super().forward(input_ids, attention_mask)
            return attention_mask.float()

    converted, _ = _run(NotExportable(), tmp_path, tracer="auto")
    assert converted.tracer == "torch.jit.trace"
    assert converted.fallback_reason.startswith("torch.export failed")


# --- options ---------------------------------------------------------------------------------------
def test_option_files_are_valid():
    assert options_from_config(OmegaConf.to_container(OmegaConf.load(CONF / "export" / "coreml.yaml"))).enabled
    assert not options_from_config(OmegaConf.to_container(OmegaConf.load(CONF / "export" / "none.yaml"))).enabled
    assert not options_from_config(None).enabled
    defaults = OmegaConf.to_container(OmegaConf.load(CONF / "export_model.yaml"))["defaults"]
    assert {"export": "coreml"} in defaults


@pytest.mark.parametrize(
    "values, message",
    [
        ({"precision": "fp8"}, "precision: expected 'fp16' | 'fp32', got 'fp8'"),
        ({"layout": "nchw"}, "layout: expected 'standard' | 'ane', got 'nchw'"),
        ({"compression": "int4"}, "compression: expected 'none' | 'int8' | 'palettize', got 'int4'"),
        ({"deployment_target": "iOS15"}, "deployment_target: expected .*got 'iOS15'"),
        ({"nbits": 3}, "nbits: expected 1 | 2 | 4 | 6 | 8, got 3"),
        ({"seq_lens": [32, 64]}, "needs deployment_target iOS18 or macOS15; got iOS17"),
        ({"seq_lens": [32, 64], "seq_len": 48, "deployment_target": "iOS18"}, "seq_len=48 is not one of seq_lens"),
        ({"precison": "fp32"}, "unknown key"),
        ({"batch_size": 0}, r"batch_size: must be in \[1, 4096\], got 0"),
    ],
)
def test_bad_options_are_one_line_config_errors(values, message):
    with pytest.raises(ConfigError, match=message) as info:
        options_from_config({"format": "coreml", **values})
    assert "\n" not in str(info.value) and str(info.value).startswith("config error: export")


def test_variant_names_and_tolerances():
    assert ExportOptions().variant == "standard-fp16" and ExportOptions().verify_tolerance == 1e-2
    assert ExportOptions(precision="fp32").verify_tolerance == 1e-4
    assert ExportOptions(layout="ane", compression="int8").variant == "ane-fp16-int8"
    assert ExportOptions(compression="palettize", nbits=4).variant == "standard-fp16-pal4"
    assert ExportOptions(tolerance=0.3).verify_tolerance == 0.3


def test_training_app_export_group_composes():
    from conftest import compose_train

    defaults = OmegaConf.to_container(OmegaConf.load(CONF / "train.yaml"))["defaults"]
    has_group = any(isinstance(d, dict) and "export" in d for d in defaults)
    cfg = compose_train(["export=coreml" if has_group else "+export=coreml", "export.layout=ane"])
    options = options_from_config(cfg.export)
    assert options.enabled and options.layout == "ane"
    if has_group:  # the default is no export
        assert not options_from_config(compose_train([]).export).enabled
