"""The backend matrix on a CPU: every backend x precision x compile x optimisation switch either runs, warns, or
fails before training with a message naming the key. CUDA and MPS are simulated (availability, bf16 support)."""

from __future__ import annotations

import itertools
import logging

import pytest
import torch

from conftest import compose_train
from sweeplab.core.errors import ConfigError, UserError
from sweeplab.engine.plan import plan
from sweeplab.runtime import backends

BACKENDS = ("cpu", "mps", "cuda")
PRECISIONS = ("32-true", "bf16-mixed", "16-mixed", "bf16-true")
COMPILES = ("off", "default", "reduce-overhead", "max-autotune")
IMPLEMENTATIONS = ("auto", "fused", "foreach", "for_loop")


@pytest.fixture
def fake_gpus(monkeypatch):
    """CUDA (an H100, bf16 capable) and MPS (macOS 14) both 'present'."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a, **k: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(backends, "mps_available", lambda: True)
    monkeypatch.setattr(backends, "_mps_macos_at_least", lambda major: True)


def expected(backend: str, precision: str, compile_mode: str, implementation: str, pin: bool, ckpt: bool):
    """The rules, written independently of backends.py: (error key or None, warning keys)."""
    if backend == "cpu" and precision == "16-mixed":
        return "trainer.precision", set()
    if compile_mode == "reduce-overhead" and backend != "cuda":
        return "compile", set()
    warns = set()
    if backend == "mps" and compile_mode != "off":
        warns.add("compile")
    if backend == "cpu" and compile_mode == "max-autotune":
        warns.add("compile")
    if implementation == "foreach" and backend in ("cpu", "mps"):  # no multi-tensor kernels there: it loops
        warns.add("optim.implementation")
    if pin and backend in ("cpu", "mps"):
        warns.add("data.pin_memory")
    if ckpt and compile_mode == "reduce-overhead":
        warns.add("model.gradient_checkpointing")
    return None, warns


MATRIX = list(itertools.product(BACKENDS, PRECISIONS, COMPILES, IMPLEMENTATIONS, (False, True), (False, True)))


def test_the_whole_matrix_fails_early_or_warns_as_specified(fake_gpus, caplog):
    outcomes = {"ok": 0, "warn": 0, "error": 0}
    for backend, precision, compile_mode, implementation, pin, ckpt in MATRIX:
        error_key, warn_keys = expected(backend, precision, compile_mode, implementation, pin, ckpt)
        kwargs = dict(optim_implementation=implementation, pin_memory=pin, gradient_checkpointing=ckpt)
        where = f"{backend} {precision} compile={compile_mode} {implementation} pin={pin} ckpt={ckpt}"
        if error_key:
            with pytest.raises(ConfigError) as info:
                backends.check_combination(backend, precision, compile_mode, **kwargs)
            assert info.value.key == error_key, where
            assert " use " in str(info.value), f"{where}: the message names no fix: {info.value}"
            outcomes["error"] += 1
            continue
        warnings = backends.check_combination(backend, precision, compile_mode, **kwargs)
        got = {w.split("=")[0].split(" ")[0] for w in warnings}
        assert got == warn_keys, f"{where}: warned {warnings}"
        outcomes["warn" if warnings else "ok"] += 1
    assert len(MATRIX) == 768 and all(outcomes.values())


def test_bf16_on_a_gpu_without_it_fails(monkeypatch, fake_gpus):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a, **k: "Tesla T4")
    with pytest.raises(ConfigError, match="not supported by Tesla T4; use 16-mixed"):
        backends.check_combination("cuda", "bf16-mixed", "off")
    backends.check_combination("cuda", "16-mixed", "off")


def test_bf16_on_old_macos_fails(monkeypatch, fake_gpus):
    monkeypatch.setattr(backends, "_mps_macos_at_least", lambda major: False)
    with pytest.raises(ConfigError, match="macOS 14"):
        backends.check_combination("mps", "bf16-mixed", "off")


def test_fused_optimizer_needs_a_recent_torch(monkeypatch):
    monkeypatch.setattr(backends, "_torch_version", lambda: (2, 3))
    with pytest.raises(ConfigError, match="fused Adam/AdamW on cpu needs torch >= 2.4"):
        backends.check_combination("cpu", "32-true", "off", optim_implementation="fused")
    backends.check_combination("cuda", "32-true", "off", optim_implementation="fused")


def test_compile_on_cpu_needs_a_compiler(monkeypatch):
    monkeypatch.setattr(backends, "_has_cxx_compiler", lambda: False)
    with pytest.raises(ConfigError, match="C\\+\\+ compiler"):
        backends.check_combination("cpu", "32-true", "default")


def test_unknown_values_name_the_key():
    for args, kwargs, key in [
        (("cpu", "64-true", "off"), {}, "trainer.precision"),
        (("cpu", "32-true", "fast"), {}, "compile"),
        (("cpu", "32-true", "off"), {"optim_implementation": "apex"}, "optim.implementation"),
    ]:
        with pytest.raises(ConfigError) as info:
            backends.check_combination(*args, **kwargs)
        assert info.value.key == key


# --- through the real config: plan() refuses before any data is read ------------------------------
PLAN_MATRIX = list(itertools.product(("cpu", "mps", "cuda", "auto"), PRECISIONS, COMPILES))


@pytest.mark.parametrize("model", ["textbridge", "pagating_lm"])
def test_plan_checks_backend_precision_compile_for_both_models(model, fake_gpus, tmp_path):
    outcomes = set()
    base = compose_train([f"model={model}", f"data.path={tmp_path}", "logger=none"])
    for backend, precision, compile_mode in PLAN_MATRIX:
        cfg = base.copy()
        cfg.backend.name, cfg.trainer.precision, cfg.compile = backend, precision, compile_mode
        resolved = "cuda" if backend == "auto" else backend  # auto prefers CUDA
        error_key, _ = expected(resolved, precision, compile_mode, "auto", False, False)
        if error_key:
            with pytest.raises(ConfigError) as info:
                plan(cfg)
            assert info.value.key == error_key
            outcomes.add("error")
        else:
            job = plan(cfg)
            assert job.backend == resolved and job.compile_mode == compile_mode
            outcomes.add("ok")
    assert outcomes == {"ok", "error"}


def test_a_missing_backend_fails_with_the_alternative(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(backends, "mps_available", lambda: False)
    with pytest.raises(UserError, match="backend=cuda: no CUDA device .* use backend=cpu or backend=auto"):
        backends.resolve_backend("cuda")
    with pytest.raises(UserError, match="backend=mps: MPS is not available"):
        backends.resolve_backend("mps")
    assert backends.resolve_backend("auto") == "cpu"


def test_warnings_are_logged(fake_gpus, caplog):
    with caplog.at_level(logging.WARNING, logger="sweeplab.runtime.backends"):
        backends.check_combination("mps", "32-true", "default")
    assert "experimental" in caplog.text
