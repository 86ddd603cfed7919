"""The paGating LM's speed switches (issue 40): model.lm_loss, model.attention, model.float8. Each is applied (in the
run's params and in the model), refused in one line where it cannot run, and the bench's hand-written loop runs the
same switch (it builds its model through the family's task)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient
from torch.nn.attention import SDPBackend

from conftest import compose_train
from sweeplab import bench
from sweeplab.core.errors import ConfigError
from sweeplab.engine import rules
from sweeplab.engine.plan import plan
from sweeplab.engine.training import train
from sweeplab.families.pagating_lm.task import LMTask
from sweeplab.models import gpt
from sweeplab.models.gpt import GPT, SIZES, GPTConfig

LM = ["model=pagating_lm", "debug=smoke", "trainer.enable_progress_bar=false"]


def _lm(tmp_path: Path, *extra: str) -> list[str]:
    return [*LM, f"data.cache_dir={tmp_path / 'lm'}", *extra]


# --- the chunked loss --------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [None, torch.bfloat16])
def test_the_chunked_loss_matches_the_full_one_in_value_and_gradients(dtype):
    losses, grads = {}, {}
    x = torch.randint(0, 1000, (2, 64), generator=torch.Generator().manual_seed(1))
    y = torch.randint(0, 1000, (2, 64), generator=torch.Generator().manual_seed(2))
    y[0, :7] = -100  # ignored labels count in neither the sum nor the mean
    for mode in ("full", "chunked"):
        torch.manual_seed(0)
        model = GPT(GPTConfig(vocab_size=1000, **SIZES["tiny"], lm_loss=mode, loss_chunks=3))  # 128 rows: uneven chunks
        with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
            loss = model.loss(x, y)
        loss.backward()
        losses[mode] = loss.detach()
        grads[mode] = {name: p.grad.clone() for name, p in model.named_parameters()}
    tol = dict(rtol=1e-5, atol=1e-6) if dtype is None else dict(rtol=2e-2, atol=1e-3)  # bf16 matmuls, other order
    torch.testing.assert_close(losses["chunked"], losses["full"], **tol)
    for name, grad in grads["full"].items():
        torch.testing.assert_close(grads["chunked"][name], grad, **tol, msg=name)


def test_a_loss_scaled_after_the_chunked_head_scales_its_gradients():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=512, **SIZES["tiny"], lm_loss="chunked"))
    x = torch.randint(0, 512, (1, 32))
    (model.loss(x, x) * 3.0).backward()
    once = model.wte.weight.grad.clone()
    model.zero_grad()
    model.loss(x, x).backward()
    torch.testing.assert_close(once, 3.0 * model.wte.weight.grad)


# --- applied: params, model, raw loop ------------------------------------------------------------------
def test_chunked_loss_is_in_the_params_and_the_raw_loop_trains_the_same_weights(tmp_path, mlflow_uri, monkeypatch):
    calls = []
    real = gpt.chunked_cross_entropy
    monkeypatch.setattr(gpt, "chunked_cross_entropy", lambda *a, **k: calls.append(1) or real(*a, **k))
    cfg = compose_train(_lm(tmp_path, "model.lm_loss=chunked", "trainer.max_steps=4", "trainer.val_check_interval=4"))
    train(cfg)
    (run,) = MlflowClient(mlflow_uri).search_runs([MlflowClient(mlflow_uri).get_experiment_by_name("sweeplab").experiment_id])
    assert run.data.params["model.lm_loss"] == "chunked"
    assert len(calls) >= 4  # every training step went through the chunked head
    (ckpt,) = (Path.cwd() / "outputs" / "checkpoints").glob("best-step*.ckpt")
    trained = torch.load(ckpt, map_location="cpu", weights_only=True)["state_dict"]

    calls.clear()
    raw = bench.RawLoop(cfg)
    assert raw.model.config.lm_loss == "chunked"
    raw.run(warmup_steps=0, steps=4)
    assert len(calls) == 4
    for name, value in raw.model.state_dict().items():
        torch.testing.assert_close(value, trained[f"model.{name}"], rtol=1e-4, atol=1e-5, msg=name)


def test_float8_and_attention_reach_the_model_the_task_and_the_raw_loop(tmp_path, monkeypatch):
    pytest.importorskip("torchao")
    from torchao.float8.float8_linear import Float8Linear

    # this machine has no Hopper GPU: the rule that refuses it here is tested below; the building is tested here
    monkeypatch.setattr(rules, "check_speed_switches", lambda *a, **k: [])
    cfg = compose_train(_lm(tmp_path, "model.float8=blocks", "model.attention=cudnn"))
    p = plan(cfg)
    assert (p.model_config.float8, p.model_config.attention) == ("blocks", "cudnn")
    raw = bench.RawLoop(cfg)
    for model in (raw.model, p.family.make_task(p.model_config, {}, p.optim).model):
        block = model.blocks[0]
        assert isinstance(block.attn.qkv, Float8Linear) and isinstance(block.mlp.proj, Float8Linear)
        assert not isinstance(model.lm_head, Float8Linear)  # blocks only
        assert model.lm_head.weight is model.wte.weight
        assert block.attn.kernels == [SDPBackend.CUDNN_ATTENTION]
    head = LMTask(GPTConfig(vocab_size=1024, **SIZES["tiny"], float8="head"), None, p.optim)
    assert head.float8_layers == ["lm_head"] and not isinstance(head.model.blocks[0].attn.qkv, Float8Linear)
    task = LMTask(GPTConfig(vocab_size=1024, **SIZES["tiny"], float8="all"), None, p.optim)
    assert "lm_head" in task.float8_layers and isinstance(task.model.lm_head, Float8Linear)
    assert task.model.lm_head.weight is task.model.wte.weight  # still tied
    # a float8-trained checkpoint holds plain Linear weights: the export's GPT(config) loads it
    GPT(task.model.config).load_state_dict(task.model.state_dict())


def test_the_attention_kernel_is_pinned_on_cuda_only():
    """An exported or CPU-evaluated checkpoint of a cudnn-attention run computes as any other."""
    torch.manual_seed(0)
    pinned = GPT(GPTConfig(vocab_size=256, **SIZES["tiny"], attention="cudnn"))
    plain = GPT(GPTConfig(vocab_size=256, **SIZES["tiny"]))
    plain.load_state_dict(pinned.state_dict())
    x = torch.randint(0, 256, (2, 16))
    torch.testing.assert_close(pinned(x), plain(x))


# --- refused ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("override, key, text", [
    ("model.lm_loss=liger", "model.lm_loss", "liger runs Triton kernels on CUDA (this job runs on cpu)"),
    ("model.float8=blocks", "model.float8", "float8 matmuls need an NVIDIA GPU of compute capability >= 8.9"),
    ("model.attention=cudnn", "model.attention", "cudnn pins a CUDA attention kernel (this job runs on cpu)"),
    ("model.lm_loss=wide", "model", "model.lm_loss='wide' is not one of full, chunked, liger"),
])
def test_a_switch_that_cannot_run_here_is_refused_naming_its_key(override, key, text, tmp_path):
    with pytest.raises(ConfigError, match=re.escape(text)) as err:
        plan(compose_train(_lm(tmp_path, override)))
    assert str(err.value).startswith(f"config error: {key}:") and "\n" not in str(err.value)


def test_float8_is_refused_on_a_gpu_older_than_hopper_and_warned_about_without_compile(monkeypatch):
    config = GPTConfig(vocab_size=1024, **SIZES["tiny"], float8="blocks")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA A100-SXM4-80GB")
    with pytest.raises(ConfigError, match=r"model.float8: blocks: .*A100-SXM4-80GB has 8.0"):
        rules.check_speed_switches(config, "cuda", "default")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    assert rules.check_speed_switches(config, "cuda", "default") == []
    (warning,) = rules.check_speed_switches(config, "cuda", "off")
    assert "compile=off" in warning


def test_the_switches_are_refused_for_the_mlx_port_and_float8_all_with_a_chunked_head():
    with pytest.raises(ConfigError, match="model.lm_loss: chunked is a PyTorch training switch; backend=mlx"):
        rules.check_speed_switches(GPTConfig(vocab_size=64, **SIZES["tiny"], lm_loss="chunked"), "mlx", "off")
    with pytest.raises(ValueError, match="model.float8=all converts the LM head, which lm_loss=chunked bypasses"):
        GPTConfig(vocab_size=64, **SIZES["tiny"], lm_loss="chunked", float8="all")


def test_a_family_without_an_lm_head_refuses_the_switch_in_one_line(tmp_path):
    done = subprocess.run([sys.executable, "-m", "sweeplab.train", "model=textbridge", "model.lm_loss=chunked"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    lines = [li for li in done.stderr.splitlines() if li.strip()]
    assert len(lines) == 1 and "model.lm_loss" in lines[0], done.stderr[-2000:]
    assert not (tmp_path / "outputs").exists() and not (tmp_path / "mlflow.db").exists()


# --- the bench reports them ------------------------------------------------------------------------------
def test_the_bench_table_names_the_switches_and_reports_compile_time_and_final_loss(tmp_path):
    cfg = compose_train(_lm(tmp_path, "model.lm_loss=chunked", "model.float8=blocks", "model.attention=cudnn",
                            "compile=max-autotune"))
    result = bench.RowResult(bench.BenchRow("x", []), cfg, sweeplab=[{"summary/samples_per_sec": 10.0, "val/loss": 3.21}],
                             raw=[{"samples_per_sec": 10.0}], compile_s=42.5)
    (row,) = bench.table_rows([result])
    assert row["switches"] == "chunked LM loss, cudnn attention, float8 blocks"
    assert row["compile"] == "max-autotune" and row["compile (s)"] == "42.5" and row["final loss"] == "3.21"


def test_the_raw_loop_reports_its_warm_up_time(tmp_path):
    raw = bench.RawLoop(compose_train(_lm(tmp_path)))
    ticks = iter(range(100))
    out = raw.run(warmup_steps=1, steps=1, clock=lambda: float(next(ticks)))
    assert out["warmup_s"] == 1.0 and out["step_time_s"] == 1.0
