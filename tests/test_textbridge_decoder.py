"""The TextBridge decoder (cube -> text): no look-ahead, its teacher forcing, the step the Core ML package holds,
its checkpoint round trip and its Core ML export, and the family's one-line refusals. Slow: the training app end to
end (metrics, resume, export, sweep) and the 100-sentence overfit check."""

from __future__ import annotations

import lightning as L
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from conftest import compose_train
from sweeplab.core.errors import ConfigError
from sweeplab.engine.plan import plan
from sweeplab.export import ExportOptions, export_checkpoint, load_program
from sweeplab.families import get_family
from sweeplab.families.loading import load_model
from sweeplab.models.textbridge_decoder import (
    IGNORE_INDEX,
    DecoderConfig,
    DecoderStep,
    TextBridgeDecoder,
    teacher_forcing,
)
from sweeplab.tasks.optim import OptimConfig

VOCAB, EMBED, MAX_LEN, BOS, EOS = 200, 24, 12, 2, 3
CONFIG = DecoderConfig(vocab_size=VOCAB, embed_dim=EMBED, max_len=MAX_LEN, n_prefix=2, n_layer=2, n_head=2, d_model=32,
                       d_ff=64, bos_id=BOS, eos_id=EOS)


def _model(seed: int = 0) -> TextBridgeDecoder:
    torch.manual_seed(seed)
    return TextBridgeDecoder(CONFIG).eval()


def _inputs(batch: int = 3, length: int = MAX_LEN + 1, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, EMBED, generator=g), torch.randint(4, VOCAB, (batch, length), generator=g)


# --- masking: no position sees a later one --------------------------------------------------------
@pytest.mark.parametrize("with_mask", [False, True])
def test_a_future_token_changes_no_earlier_logit(with_mask):
    model = _model()
    embedding, ids = _inputs()
    mask = torch.ones_like(ids) if with_mask else None
    k = 6
    changed = ids.clone()
    changed[:, k] = (changed[:, k] + 1) % VOCAB
    with torch.no_grad():
        before, after = model(embedding, ids, mask), model(embedding, changed, mask)
    torch.testing.assert_close(after[:, :k], before[:, :k], rtol=0, atol=1e-6)
    assert (after[:, k:] - before[:, k:]).abs().amax() > 1e-3  # the token itself and what follows do see it


def test_the_embedding_conditions_the_first_token():
    model = _model()
    embedding, ids = _inputs()
    with torch.no_grad():
        a, b = model(embedding, ids[:, :1]), model(embedding.flip(0), ids[:, :1])
    assert (a - b).abs().amax() > 1e-3


# --- teacher forcing ---------------------------------------------------------------------------------
def test_teacher_forcing_shifts_and_ends_each_sentence():
    ids = torch.tensor([[10, 11, 12, 0], [20, 0, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
    inputs, labels = teacher_forcing(ids, mask, BOS, EOS)
    assert inputs.tolist() == [[BOS, 10, 11, 12, 0], [BOS, 20, 0, 0, 0]]
    assert labels.tolist() == [[10, 11, 12, EOS, IGNORE_INDEX], [20, EOS, IGNORE_INDEX, IGNORE_INDEX, IGNORE_INDEX]]


# --- the step the package holds ----------------------------------------------------------------------
def test_step_is_the_models_logit_after_the_last_real_token():
    model = _model()
    embedding, ids = _inputs()
    lengths = [1, 5, MAX_LEN + 1]
    mask = torch.zeros_like(ids)
    for row, n in enumerate(lengths):
        mask[row, :n] = 1
    padded = torch.where(mask.bool(), ids, 0)
    with torch.no_grad():
        step = DecoderStep(model)(padded, mask, embedding)
        for row, n in enumerate(lengths):
            full = model(embedding[row : row + 1], ids[row : row + 1, :n])[0, -1]
            torch.testing.assert_close(step[row], full, rtol=0, atol=1e-5)


def test_generate_follows_the_step_and_stops_at_eos():
    model = _model()
    embedding, _ = _inputs(batch=2)
    rows = model.generate(embedding, max_tokens=5)
    for row, sentence in enumerate(rows):
        assert EOS not in sentence and len(sentence) <= 5
        ids = torch.tensor([[BOS, *sentence]])
        with torch.no_grad():
            following = int(model(embedding[row : row + 1], ids)[0, -1].argmax())
        if len(sentence) < 5:
            assert following == EOS  # a sentence shorter than the limit ended because EOS came next


# --- a trained checkpoint: round trip and export -----------------------------------------------------
@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    batches = []
    for _ in range(3):
        ids = torch.randint(4, VOCAB, (4, MAX_LEN), generator=g)
        mask = (torch.arange(MAX_LEN)[None] < torch.randint(1, MAX_LEN + 1, (4, 1), generator=g)).long()
        batches.append({"input_ids": ids * mask, "attention_mask": mask, "target": torch.randn(4, EMBED, generator=g)})
    task = get_family("textbridge_decoder").make_task(CONFIG, {}, OptimConfig(lr=3e-2, warmup_steps=1))
    directory = tmp_path_factory.mktemp("decoder")
    trainer = L.Trainer(accelerator="cpu", max_steps=3, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, default_root_dir=str(directory))
    trainer.fit(task, train_dataloaders=DataLoader(batches, batch_size=None))
    path = directory / "checkpoints" / "best-step3.ckpt"
    trainer.save_checkpoint(path)
    return path, task.model.eval()


def test_checkpoint_round_trip_gives_identical_logits(checkpoint):
    path, trained = checkpoint
    loaded = load_model(path, expect_family="textbridge_decoder")
    assert loaded.model_config == CONFIG
    embedding, ids = _inputs()
    fresh = _model(seed=1)
    with torch.no_grad():
        expected = trained(embedding, ids)
        assert torch.equal(loaded.model(embedding, ids), expected)
        assert not torch.allclose(fresh(embedding, ids), expected)  # a model that was not loaded differs
    assert loaded.model.generate(embedding) == trained.generate(embedding)


def test_core_ml_step_export_matches_the_model(checkpoint, tmp_path):
    path, trained = checkpoint
    result = export_checkpoint(path, ExportOptions(precision="fp32", n_random=2, readiness=False), tmp_path)
    report = result.report
    assert report["status"] == "passed", report["failure"]
    assert report["verification"]["reference"]["rel_err"] <= 1e-4
    assert report["verification"]["trained_weights"]["passed"]
    program = load_program(result.package)
    inputs = {i.name: i for i in program.spec.description.input}
    assert list(inputs) == ["input_ids", "attention_mask", "embedding"]
    assert list(inputs["input_ids"].type.multiArrayType.shape) == [1, MAX_LEN + 1]  # BOS + max_len tokens
    # the package, run on Linux by the reference evaluator, against the training model's own logits
    embedding, ids = _inputs(batch=1)
    n = 7
    mask = (torch.arange(MAX_LEN + 1)[None] < n).int()
    padded = (ids * mask).int()
    out = program.run({"input_ids": padded.numpy(), "attention_mask": mask.numpy(), "embedding": embedding.numpy()})
    with torch.no_grad():
        expected = trained(embedding, ids[:, :n])[:, -1].numpy()
    np.testing.assert_allclose(out["logits"], expected, rtol=0, atol=1e-4 * np.abs(expected).max())


# --- refusals ----------------------------------------------------------------------------------------
def test_bad_special_ids_are_refused():
    with pytest.raises(ValueError, match="model.eos_id=500 is outside the vocabulary"):
        DecoderConfig(vocab_size=VOCAB, eos_id=500)


def test_mlx_plans_the_decoder():  # its MLX port: families/textbridge_decoder/mlx_model.py, tests/test_mlx_parity.py
    pytest.importorskip("mlx.core")
    p = plan(compose_train(["model=textbridge_decoder", "backend=mlx"]))
    assert p.backend == "mlx" and p.family.mlx_model is not None


def test_layout_ane_is_refused_in_one_line():
    with pytest.raises(ConfigError, match="export.layout: the textbridge_decoder family has no Neural-Engine layout"):
        plan(compose_train(["model=textbridge_decoder", "export=coreml", "export.layout=ane"]))


# --- slow: the overfit check -------------------------------------------------------------------------
OVERFIT_STEPS, OVERFIT_SECONDS, CHECK_EVERY = 2000, 180.0, 25


def _all_sentences(dm) -> dict:
    from sweeplab.families.textbridge.data import collate_textbridge

    return collate_textbridge([dm.train_dataset[k] for k in range(len(dm.train_dataset))], dm.pad_id)


def _forced_exact_match(task, batch: dict) -> float:
    """Sentences whose every teacher-forced argmax (EOS included) is right: under greedy decoding exactly those come
    back whole (a cheap screen; the test's verdict is the greedy decode's)."""
    inputs, labels = task._teacher_forcing(batch)
    with torch.no_grad():
        right = (task.model(batch["target"], inputs).argmax(-1) == labels) | (labels == IGNORE_INDEX)
    return float(right.all(1).float().mean())


def _greedy_exact_match(model: TextBridgeDecoder, batch: dict) -> float:
    from sweeplab.families.textbridge_decoder.task import sentence_ids

    decoded = model.generate(batch["target"])
    return float(np.mean([d == r for d, r in zip(decoded, sentence_ids(batch["input_ids"], batch["attention_mask"]))]))


@pytest.mark.slow
@pytest.mark.parametrize("teacher", ["random", "minilm"])
def test_overfits_100_sentences_from_teacher_embeddings(tmp_path, teacher):
    """The first 100 sentences of the demo corpus with their teacher embeddings (the seeded random DistilBERT, or
    all-MiniLM-L6-v2 with its own 30,522-token vocabulary): greedy decoding gives back >= 95 % of them exactly within
    2,000 steps and 3 minutes on the CPU, checks included (every 25 steps a teacher-forced screen of all 100, then
    the greedy decode that decides)."""
    import time

    from sweeplab.families.textbridge.data import TextBridgeDataModule
    from sweeplab.families.textbridge.prepare import prepare_textbridge_demo
    from sweeplab.models.textbridge_decoder import SIZES
    from sweeplab.tasks.optim import build_optimizer, build_scheduler

    data = prepare_textbridge_demo(tmp_path / "data", n_sentences=100, teacher=teacher, progress=False)
    family = get_family("textbridge_decoder")
    dm = TextBridgeDataModule(path=str(data), batch_size=32, val_fraction=0.0, max_len=64)
    dm.setup()
    everything = _all_sentences(dm)
    config = family.fitted_model_config(DecoderConfig(max_len=64, **SIZES["small"]), dm, {})
    torch.manual_seed(0)
    optim = OptimConfig(lr=2e-3, warmup_steps=50)
    task = family.make_task(config, {}, optim)
    optimizer = build_optimizer(task.model, optim)
    scheduler = build_scheduler(optimizer, optim, OVERFIT_STEPS)
    step, exact, start = 0, 0.0, time.perf_counter()
    while step < OVERFIT_STEPS and exact < 0.95:
        for batch in dm.train_dataloader():
            loss, _ = task.training_loss(batch)
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(task.model.parameters(), optim.grad_clip)
            optimizer.step()
            scheduler.step()
            step += 1
            if step % CHECK_EVERY == 0 and _forced_exact_match(task, everything) >= 0.95:
                exact = _greedy_exact_match(task.model.eval(), everything)
                task.model.train()
            if exact >= 0.95 or step >= OVERFIT_STEPS:
                break
    elapsed = time.perf_counter() - start
    print(f"{teacher}: exact match {exact:.2f} after {step} steps, {elapsed:.0f} s")
    assert exact >= 0.95, f"exact match {exact:.2f} after {step} steps"
    assert elapsed <= OVERFIT_SECONDS, f"{elapsed:.0f} s to exact match {exact:.2f} ({step} steps)"


# --- slow: the training app end to end -----------------------------------------------------------------
@pytest.mark.slow
def test_the_training_app_trains_resumes_and_exports_the_decoder(demo_dir, mlflow_uri, tmp_path):
    from mlflow.tracking import MlflowClient
    from omegaconf import open_dict

    from sweeplab.engine.training import train

    def config(*overrides: str):
        cfg = compose_train(["model=textbridge_decoder", "debug=smoke", f"data.path={demo_dir}", "data.batch_size=16",
                             "model.max_len=32", "trainer.val_check_interval=5", "checkpoint.every_n_steps=5",
                             "trainer.log_every_n_steps=5", "trainer.limit_val_batches=1", "export=coreml",
                             "export.n_random=1", "export.readiness=false", "export.overwrite=true", *overrides])
        with open_dict(cfg):
            cfg.trainer.enable_progress_bar = False
        return cfg

    train(config("trainer.max_steps=10"))
    ckpt = tmp_path / "outputs" / "checkpoints" / "last.ckpt"
    objective = train(config("trainer.max_steps=15", f"resume={ckpt}"))
    client = MlflowClient(mlflow_uri)
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments() if e.name == "sweeplab"])
    assert run.info.status == "FINISHED" and run.data.tags["family"] == "textbridge_decoder"
    assert {"train/loss", "train/step_time_s", "train/samples_per_sec", "train/tokens_per_sec", "val/loss",
            "val/token_acc", "val/exact_match", "val/chrf", "summary/samples_per_sec"} <= set(run.data.metrics)
    assert [m.step for m in client.get_metric_history(run.info.run_id, "train/loss")] == [4, 9, 14]
    assert objective == min(m.value for m in client.get_metric_history(run.info.run_id, "val/loss"))
    exported = {a.path for a in client.list_artifacts(run.info.run_id, "coreml")}
    assert "coreml/textbridge_decoder-standard-fp16.mlpackage" in exported


# --- the round trip's two starts: text, or token ids only (an EFB1 file) ---------------------------
def test_the_round_trip_from_token_ids_equals_the_one_from_text(demo_dir):
    """Data holding token ids without text (EFB1) feeds the encoder those ids: the cubes, decodes and scores equal
    the ones from the text that the ids were made from."""
    from sweeplab.data.tokenizer import TextTokenizer
    from sweeplab.families.textbridge.formats import open_dataset
    from sweeplab.families.textbridge_decoder.roundtrip import round_trip
    from sweeplab.models.textbridge import TextBridgeConfig, TextBridgeEncoder

    tokenizer = TextTokenizer.load(demo_dir / "tokenizer.json")
    source = open_dataset(demo_dir / "demo.tokens.jsonl")
    samples = [source[i] for i in range(6)]
    texts = [s.text for s in samples]
    ids = [s.input_ids.tolist() for s in samples]
    assert tokenizer.encode(texts, 64)[0] == ids  # the ids are the text's, so both starts must agree
    torch.manual_seed(0)
    encoder = TextBridgeEncoder(TextBridgeConfig(vocab_size=tokenizer.vocab_size, d_model=16, d_hidden=16, n_blocks=1,
                                                 dilations=[1], out_dim=EMBED, max_len=64)).eval()
    decoder = TextBridgeDecoder(DecoderConfig(vocab_size=tokenizer.vocab_size, embed_dim=EMBED, max_len=MAX_LEN,
                                              n_prefix=2, n_layer=1, n_head=2, d_model=16, d_ff=32, bos_id=BOS,
                                              eos_id=EOS)).eval()
    targets = np.random.default_rng(0).standard_normal((6, EMBED)).astype(np.float32)
    from_text = round_trip(encoder, decoder, tokenizer, texts, ids, targets)
    from_ids = round_trip(encoder, decoder, tokenizer, None, ids, targets)
    assert from_ids.metrics == from_text.metrics and from_ids.from_cube == from_text.from_cube
    assert from_ids.metrics["sentences"] == 6.0
