"""A real (tiny) Hugging Face encoder saved to a local directory serves as the teacher, with the network cut off."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers

from sweeplab.data.corpus import demo_sentences
from sweeplab.data.tokenizer import TextTokenizer
from sweeplab.families.textbridge.formats import open_dataset
from sweeplab.families.textbridge.prepare import prepare_textbridge_demo, read_manifest
from sweeplab.families.textbridge.teacher import Teacher

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
TINY = {"n_sentences": 24, "vocab_size": 300, "progress": False}


pytestmark = pytest.mark.usefixtures("no_network")  # conftest: any hub access fails loudly


def save_tiny_encoder(directory: Path, architecture: str) -> Path:
    """A 1-layer, 32-wide encoder and a BERT-style tokenizer (with [CLS]/[SEP]), saved with save_pretrained."""
    from transformers import BertConfig, BertModel, DistilBertConfig, DistilBertModel, PreTrainedTokenizerFast

    backend = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    backend.normalizer = normalizers.BertNormalizer(lowercase=True)
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.train_from_iterator(
        demo_sentences()[:40], trainers.WordPieceTrainer(vocab_size=200, special_tokens=SPECIAL)
    )
    cls_id, sep_id = backend.token_to_id("[CLS]"), backend.token_to_id("[SEP]")
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)]
    )
    hf_tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )
    vocab_size = backend.get_vocab_size()
    torch.manual_seed(0)
    if architecture == "distilbert":
        config = DistilBertConfig(vocab_size=vocab_size, dim=32, n_layers=1, n_heads=2, hidden_dim=64)
        model = DistilBertModel(config)
    else:
        config = BertConfig(
            vocab_size=vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64
        )
        model = BertModel(config, add_pooling_layer=False)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    hf_tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module", params=["distilbert", "bert"])
def encoder_dir(request, tmp_path_factory) -> Path:
    return save_tiny_encoder(tmp_path_factory.mktemp("encoders") / request.param, request.param)


def test_prepare_with_a_local_teacher_directory(encoder_dir, tmp_path):
    from transformers import AutoModel, AutoTokenizer

    out = prepare_textbridge_demo(tmp_path / "demo", teacher_path=encoder_dir, **TINY)
    manifest = read_manifest(out)
    assert manifest["target_dim"] == 32 and manifest["num_samples"] == 24
    assert manifest["settings"]["teacher"]["kind"] == "local"
    assert manifest["settings"]["teacher"]["path"] == str(encoder_dir)

    # Targets = the model's mean-pooled last_hidden_state over its own tokenisation (special tokens included).
    model = AutoModel.from_pretrained(encoder_dir, local_files_only=True).eval()
    hf_tokenizer = AutoTokenizer.from_pretrained(encoder_dir, local_files_only=True)
    sentence = demo_sentences()[0]
    encoded = hf_tokenizer([sentence], return_tensors="pt")
    assert encoded["input_ids"][0, 0] == hf_tokenizer.cls_token_id
    with torch.no_grad():
        expected = model(**encoded).last_hidden_state[0].mean(0).numpy()
    efb1 = open_dataset(out / manifest["files"]["efb1"])
    np.testing.assert_allclose(efb1[0].target, expected, rtol=1e-4, atol=1e-5)

    # The student's ids come from the project tokenizer, not from the teacher's.
    project_tokenizer = TextTokenizer.load(out / "tokenizer.json")
    assert efb1[0].input_ids.tolist() == project_tokenizer.encode([sentence], 128)[0][0]


def test_changed_teacher_directory_triggers_a_rebuild(tmp_path):
    encoder = save_tiny_encoder(tmp_path / "encoder", "distilbert")
    out = prepare_textbridge_demo(tmp_path / "demo", teacher_path=encoder, **TINY)
    first = (out / "demo.efb1").read_bytes()
    prepare_textbridge_demo(tmp_path / "demo", teacher_path=encoder, **TINY)
    assert (out / "demo.efb1").read_bytes() == first

    # Saved again with other weights: same path, different model.
    from transformers import AutoModel

    model = AutoModel.from_pretrained(encoder, local_files_only=True)
    with torch.no_grad():
        model.embeddings.word_embeddings.weight.mul_(2.0)
    model.save_pretrained(encoder)
    prepare_textbridge_demo(tmp_path / "demo", teacher_path=encoder, **TINY)
    assert (out / "demo.efb1").read_bytes() != first


def test_local_hf_tokenizer_directory_loads(encoder_dir):
    tokenizer = TextTokenizer.load(encoder_dir)
    assert tokenizer.pad_id == 0
    ids, masks, _ = tokenizer.encode(["the value of x"], max_len=16)
    assert tokenizer.tokenizer.token_to_id("[CLS]") not in ids[0]  # encode adds no special tokens


def test_tokenizer_directory_without_tokenizer_json_goes_through_auto_tokenizer(tmp_path):
    from transformers import BertTokenizerFast

    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "value", "of", "x", "##s"]
    (tmp_path / "vocab.txt").write_text("\n".join(words) + "\n")
    BertTokenizerFast(vocab_file=str(tmp_path / "vocab.txt")).save_pretrained(tmp_path)
    (tmp_path / "tokenizer.json").unlink()  # only vocab.txt + tokenizer_config.json remain
    tokenizer = TextTokenizer.load(tmp_path)
    assert tokenizer.encode(["The values of y"], max_len=8)[0] == [[5, 6, 9, 7, 1]]


def test_missing_teacher_directory_is_one_line(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(ValueError) as error:
        prepare_textbridge_demo(tmp_path / "demo", teacher_path=missing, **TINY)
    assert (
        str(error.value) == f"teacher path {missing}: no such directory (expected a local Hugging Face model directory)"
    )


def test_directory_that_is_not_a_model_is_one_line(tmp_path):
    not_a_model = tmp_path / "notes"
    not_a_model.mkdir()
    (not_a_model / "readme.txt").write_text("hello")
    with pytest.raises(ValueError) as error:
        prepare_textbridge_demo(tmp_path / "demo", teacher_path=not_a_model, **TINY)
    assert str(error.value) == f"teacher path {not_a_model}: no config.json, so not a Hugging Face model directory"
    assert not (tmp_path / "demo").exists()


def test_broken_model_directory_is_one_line(tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "distilbert"}')  # config but no weights, no tokenizer
    with pytest.raises(ValueError) as error:
        Teacher.from_pretrained(broken)
    message = str(error.value)
    assert message.startswith(f"teacher path {broken}: cannot load the model or its tokenizer") and "\n" not in message
