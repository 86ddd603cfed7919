"""compile_scope=regions (issue 36): the model's repeated block is compiled once for every layer, paGating's LM head
and loss as a region of their own, the rest eagerly; compile_validation=false runs validation without compiling.
The fast tests count what Dynamo compiles with its tracing backend ("eager": the same frames, guards and
recompilations as inductor, without inductor's C++ build); the slow one compiles with inductor."""

from __future__ import annotations

import dataclasses
import functools
import re

import pytest
import torch
from mlflow.tracking import MlflowClient
from torch._dynamo.testing import CompileCounterWithBackend

from conftest import compose_train, smoke_config
from sweeplab import bench
from sweeplab.core.errors import ConfigError
from sweeplab.engine import plan as plan_module
from sweeplab.engine.lightning_fit import fresh_compiler, keep_compiled_graphs
from sweeplab.engine.plan import plan
from sweeplab.engine.training import train
from sweeplab.families.pagating_lm.task import LMTask
from sweeplab.models.gpt import GPT, SIZES, GPTConfig
from sweeplab.models.textbridge import TextBridgeConfig, TextBridgeEncoder
from sweeplab.models.textbridge_decoder import DecoderConfig, TextBridgeDecoder
from sweeplab.tasks.base import compile_regions
from sweeplab.tasks.optim import OptimConfig

LM = ["model=pagating_lm", "debug=smoke", "trainer.enable_progress_bar=false"]


@pytest.fixture
def traced(monkeypatch) -> CompileCounterWithBackend:
    """torch.compile (and Module.compile, which calls it) with Dynamo's tracing backend: counts the frames compiled."""
    fresh_compiler()
    counter = CompileCounterWithBackend("eager")
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend=counter))
    yield counter
    fresh_compiler()


def _gpt(n_layer: int, **overrides) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=97, **{**SIZES["tiny"], "n_layer": n_layer, **overrides}))


def _batch(rows: int = 2, length: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, 97, (rows, length), generator=g), torch.randint(0, 97, (rows, length), generator=g)


def _static(graphs) -> bool:
    """No input of the traced graphs has a symbolic (dynamic) size."""
    return not any(isinstance(size, torch.SymInt) for graph in graphs for node in graph.graph.nodes
                   if node.op == "placeholder" and isinstance(value := node.meta.get("example_value"), torch.Tensor)
                   for size in value.shape)


# --- the models' regions ---------------------------------------------------------------------------------
@pytest.mark.parametrize("lm_loss", ["full", "chunked"])
def test_one_compiled_block_serves_every_layer_and_the_loss_is_the_eager_models(traced, lm_loss):
    ids, labels = _batch()
    frames = {}
    for n_layer in (2, 4):
        fresh_compiler()
        eager, compiled = _gpt(n_layer, lm_loss=lm_loss), _gpt(n_layer, lm_loss=lm_loss)
        names = list(compiled.state_dict())
        assert compile_regions(compiled, None) == n_layer + 1  # every block, and the head with its loss
        assert list(compiled.state_dict()) == names  # checkpoints keep their keys
        before = traced.frame_count
        compiled.loss(ids, labels).backward()
        compiled.loss(ids, labels)  # a second step compiles nothing
        frames[n_layer] = traced.frame_count - before
        loss = eager.loss(ids, labels)
        loss.backward()
        torch.testing.assert_close(compiled.loss(ids, labels), loss)
        for (name, p), q in zip(eager.named_parameters(), compiled.parameters()):
            torch.testing.assert_close(q.grad, p.grad, msg=name)
    assert frames == {2: 2, 4: 2}  # one block and the head: not one per layer


def test_the_textbridge_models_compile_one_block_per_distinct_block(traced):
    encoder = TextBridgeEncoder(TextBridgeConfig(vocab_size=50, d_model=16, d_hidden=32, n_blocks=4, dilations=[1, 2],
                                                 out_dim=8))  # blocks of dilation 1, 2, 1, 1
    assert compile_regions(encoder, None) == 4
    ids = torch.randint(0, 50, (2, 12))
    encoder(ids, torch.ones(2, 12)).sum().backward()
    assert traced.frame_count == 2  # one per dilation: a block's dilation is part of its code's guards

    frozen = TextBridgeEncoder(TextBridgeConfig(vocab_size=50, d_model=16, d_hidden=32, n_blocks=3, dilations=[1],
                                                out_dim=8, freeze="trunk_except_last"))
    assert [module for module, _ in frozen.compile_regions()] == [frozen.blocks[2]]  # frozen blocks stay eager

    fresh_compiler()
    traced.frame_count = 0
    decoder = TextBridgeDecoder(DecoderConfig(vocab_size=50, embed_dim=8, max_len=16, n_layer=3, n_head=2, d_model=16,
                                              d_ff=32, bos_id=1, eos_id=2))
    assert compile_regions(decoder, None) == 3
    decoder(torch.randn(2, 8), torch.randint(0, 50, (2, 9))).sum().backward()
    assert traced.frame_count == 1


def test_the_reset_between_jobs_still_gives_each_job_shape_specialised_blocks(traced):
    """fresh_compiler's promise (engine/lightning_fit.py) with regions: a later job's new batch size compiles a
    static block, not the dynamic-shape one Dynamo compiles when it sees a size change in the same process."""
    for rows in (2, 3):
        fresh_compiler()
        model = _gpt(2)
        compile_regions(model, None)
        model.loss(*_batch(rows)).backward()
    assert _static(traced.graphs)


# --- compiled graphs kept from job to job (keep_compiled_graphs) -------------------------------------------
def test_a_process_keeps_an_lm_configurations_graph_for_its_replicates_and_compiles_other_shapes_static(traced):
    """paGating's batches have one shape per job: its task compiles with dynamic=False and a process keeps the graphs.
    A replicate (same key, a new task) traces nothing; another batch size compiles its own static graph beside the
    first (not the dynamic one Dynamo's automatic dynamic shapes would make of a second size); the first batch size
    again traces nothing; a job that does not keep starts afresh."""
    fresh_compiler()
    ids2, ids3 = _batch(2)[0], _batch(3)[0]

    seeds = iter(range(100))

    def job(key: str, ids: torch.Tensor, keep: bool = True) -> tuple[bool, int]:
        kept = keep_compiled_graphs(key, keep)
        torch.manual_seed(next(seeds))  # each job its own weights: a kept graph must run on this model's
        task = LMTask(GPTConfig(vocab_size=97, **{**SIZES["tiny"], "n_layer": 2}), None, OptimConfig())
        task.configure_training("default")
        before = traced.frame_count
        loss = task.loss_fn({"input_ids": ids, "labels": ids})[0]
        frames = traced.frame_count - before
        torch.testing.assert_close(loss, task.training_loss({"input_ids": ids, "labels": ids})[0])  # eager
        loss.backward()
        return kept, frames

    assert _lm_task().compile_dynamic is False
    assert job("bs=2", ids2) == (False, 1)
    assert job("bs=2", ids2) == (True, 0)  # a replicate: its graph from Dynamo's memory
    assert job("bs=3", ids3) == (False, 1)  # another batch size: its own graph, the first kept
    assert job("bs=2", ids2) == (True, 0)
    assert _static(traced.graphs)
    assert job("bs=2", ids2, keep=False) == (False, 1)  # TextBridge's shapes, a CUDA-graph mode: afresh
    assert job("bs=2", ids2) == (False, 1)  # and the next keeping job starts from that fresh state


def test_kept_configurations_stay_under_half_of_dynamos_recompile_limit(traced):
    """Past Dynamo's recompile limit a function runs eagerly (silently slower): at most half the limit of
    configurations are kept, then the process starts afresh."""
    fresh_compiler()
    with torch._dynamo.config.patch(recompile_limit=4):  # its own patch: monkeypatch would delete the entry after
        assert [keep_compiled_graphs(key, True) for key in ("a", "b", "a", "b")] == [False, False, True, True]
        assert keep_compiled_graphs("c", True) is False  # a third: afresh, "a" and "b" forgotten
        assert [keep_compiled_graphs(key, True) for key in ("c", "a")] == [True, False]


def test_a_replicate_job_traces_nothing_and_textbridge_jobs_compile_afresh(traced, tmp_path, mlflow_uri, demo_dir):
    """The engine's choice: two paGating jobs of one configuration (seeds 0 and 1) in one process, the second traces
    nothing; TextBridge (automatic dynamic shapes: its widths vary on the CPU) compiles in each job."""
    common = ["compile=default", "trainer.max_steps=2", "trainer.val_check_interval=2"]
    frames = {}
    for name, cfg in (
        ("lm0", compose_train([*LM, f"data.cache_dir={tmp_path / 'lm'}", *common, "seed=0"])),
        ("lm1", compose_train([*LM, f"data.cache_dir={tmp_path / 'lm'}", *common, "seed=1"])),
        ("tb0", smoke_config(demo_dir, *common, "seed=0")),
        ("tb1", smoke_config(demo_dir, *common, "seed=1")),
    ):
        before = traced.frame_count
        train(cfg, output_dir=tmp_path / name)
        frames[name] = traced.frame_count - before
    assert frames["lm0"] >= 1 and frames["lm1"] == 0, frames
    assert frames["tb0"] >= 1 and frames["tb1"] >= 1, frames


# --- the task: training compiled, validation eager ------------------------------------------------------------
def _lm_task(n_layer: int = 2) -> LMTask:
    torch.manual_seed(0)
    return LMTask(GPTConfig(vocab_size=97, **{**SIZES["tiny"], "n_layer": n_layer}), None, OptimConfig())


def _validate(task: LMTask, ids: torch.Tensor) -> torch.Tensor:
    task.eval()
    task.on_validation_epoch_start()
    with torch.no_grad():
        task.validation_step({"input_ids": ids, "labels": ids}, 0)
    task.train()
    return task._val_loss_sum / ids.numel()


@pytest.mark.parametrize("compile_validation", [False, True])
def test_regions_train_compiled_and_validate_eagerly_unless_asked(traced, compile_validation):
    task = _lm_task()
    task.configure_training("default", compile_scope="regions", compile_validation=compile_validation)
    assert task.loss_fn == task.training_loss  # the step itself stays eager: the regions inside it are compiled
    ids, labels = _batch()
    task.loss_fn({"input_ids": ids, "labels": labels})[0].backward()
    assert traced.frame_count == 2
    eager = _validate(_lm_task(), ids)
    torch.testing.assert_close(_validate(task, ids), eager)
    # compiled validation: the block's evaluation variant (no autograd, eval mode) is compiled once, for every layer
    assert traced.frame_count == (3 if compile_validation else 2)


@pytest.mark.parametrize("compile_validation", [False, True])
def test_the_whole_scope_compiles_validation_only_when_asked(traced, compile_validation):
    task = _lm_task()
    task.configure_training("default", compile_scope="whole", compile_validation=compile_validation)
    ids, labels = _batch()
    task.loss_fn({"input_ids": ids, "labels": labels})[0].backward()
    assert traced.frame_count == 1  # training_loss, one graph
    torch.testing.assert_close(_validate(task, ids), _validate(_lm_task(), ids))
    assert traced.frame_count == (2 if compile_validation else 1)


def test_a_model_without_regions_is_refused_in_one_line(monkeypatch, tmp_path):
    real = plan_module.get_family("pagating_lm")
    monkeypatch.setattr(plan_module, "get_family", lambda name: dataclasses.replace(real, model=torch.nn.Linear))
    with pytest.raises(ConfigError) as err:
        plan(compose_train([*LM, f"data.cache_dir={tmp_path}", "compile=default", "compile_scope=regions"]))
    message = str(err.value)
    assert "\n" not in message and message.startswith("config error: compile_scope: regions: family pagating_lm's "
                                                      "model Linear declares no compile_regions()")
    assert message.endswith("use compile_scope=whole")
    with pytest.raises(ConfigError, match="compile_scope: regions does nothing with compile=off"):  # nothing compiles
        plan(compose_train([*LM, f"data.cache_dir={tmp_path}", "compile=off", "compile_scope=regions"]))

    class Plain(LMTask):  # a task whose model has no regions, configured directly (as the bench's loop does)
        family = "pagating_lm"

    task = Plain(GPTConfig(vocab_size=97, **SIZES["tiny"]), None, OptimConfig())
    task.model = torch.nn.Linear(2, 2)
    with pytest.raises(ConfigError, match=re.escape("model Linear declares no compile_regions()")):
        task.configure_training("default", compile_scope="regions")


# --- a job and the bench's loop --------------------------------------------------------------------------
def test_a_job_records_the_switches_and_the_raw_loop_compiles_the_same_regions(traced, tmp_path, mlflow_uri):
    cfg = compose_train([*LM, f"data.cache_dir={tmp_path / 'lm'}", "compile=default", "compile_scope=regions",
                         "trainer.max_steps=4", "trainer.val_check_interval=2"])
    train(cfg)
    client = MlflowClient(mlflow_uri)
    (run,) = client.search_runs([client.get_experiment_by_name("sweeplab").experiment_id])
    assert run.data.params["compile_scope"] == "regions" and run.data.params["compile_validation"] == "False"
    assert run.info.status == "FINISHED" and "val/loss" in run.data.metrics
    assert traced.frame_count == 2  # the block and the head, both validations eager

    traced.frame_count = 0
    raw = bench.RawLoop(cfg)
    assert raw.loss_fn.__name__ == "loss_fn"  # the plain function: not compiled as one graph
    assert all(block._compiled_call_impl is not None for block in raw.model.blocks)
    raw.run(warmup_steps=1, steps=1)
    assert traced.frame_count == 2

    whole = bench.RawLoop(compose_train([*LM, f"data.cache_dir={tmp_path / 'lm'}", "compile=default"]))
    assert all(block._compiled_call_impl is None for block in whole.model.blocks)
    (row,) = bench.table_rows([bench.RowResult(bench.BenchRow("x", []), cfg, sweeplab=[{"summary/samples_per_sec": 1.0}],
                                               raw=[{"samples_per_sec": 1.0}])])
    assert "regional compile" in row["switches"]


# --- with inductor ---------------------------------------------------------------------------------------
@pytest.mark.slow  # inductor builds C++ on the CPU: ~15 s per compiled model on 2 cores
def test_inductor_regions_match_the_eager_model_and_do_not_grow_with_depth():
    from torch._dynamo.utils import counters

    ids, labels = _batch()
    graphs = {}
    for n_layer in (2, 3):
        fresh_compiler()
        counters.clear()
        eager, compiled = _gpt(n_layer), _gpt(n_layer)
        compile_regions(compiled, None)
        loss = compiled.loss(ids, labels)
        loss.backward()
        graphs[n_layer] = counters["stats"]["unique_graphs"]
        reference = eager.loss(ids, labels)
        reference.backward()
        torch.testing.assert_close(loss, reference, rtol=1e-5, atol=1e-5)
        for (name, p), q in zip(eager.named_parameters(), compiled.parameters()):
            torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-5, msg=name)
    assert graphs == {2: 2, 3: 2}

    # validation: eager (the default) and compiled (the blocks' evaluation variant) give the eager model's loss
    eager = _validate(_lm_task(), ids)
    for compile_validation in (False, True):
        fresh_compiler()
        task = _lm_task()
        task.configure_training("default", compile_scope="regions", compile_validation=compile_validation)
        torch.testing.assert_close(_validate(task, ids), eager, rtol=1e-5, atol=1e-5)
    fresh_compiler()

