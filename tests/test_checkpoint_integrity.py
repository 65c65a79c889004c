"""A step once written always keeps one complete copy (a crash or a failure at every point of a re-save), and a
damaged checkpoint is recognised by its checksums (docs/robustness.md, "Run directories and checkpoints")."""

from __future__ import annotations

import json
import os
import shutil
import zlib
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from grpolab.models import checkpoint as ckpt
from grpolab.models.direct_io import DirectFile, file_crc32, save_safetensors


class FakeTokenizer:
    """What save_checkpoint asks of a tokenizer: save_pretrained(directory)."""

    def save_pretrained(self, directory) -> None:
        (Path(directory) / "tokenizer.json").write_text('{"model": "fake"}')


@pytest.fixture(scope="module")
def tiny_model():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=256,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=True,
    )
    return LlamaForCausalLM(config)


def save(run: Path, step: int, model, tag: str, direct_io: bool = True, keep_last: int = 1) -> Path:
    return ckpt.save_checkpoint(
        run, step, model, FakeTokenizer(), {"step": step, "tag": tag}, keep_last=keep_last, direct_io=direct_io
    )


def tag_of(path: Path) -> str:
    return ckpt.load_state(path)["tag"]


def test_direct_file_crc_is_zlibs_crc_of_the_content(tmp_path):
    """The writer's running CRC over several writes (one crossing the buffer's end) equals the file's CRC-32;
    the standard check value of CRC-32 is 0xcbf43926 for b"123456789"."""
    parts = [b"123456789", os.urandom(3 << 20), bytes(range(256)) * 70000]
    with DirectFile(tmp_path / "f") as f:
        for p in parts:
            f.write(p)
    assert (f.size, f.crc32) == file_crc32(tmp_path / "f") == (sum(map(len, parts)), zlib.crc32(b"".join(parts)))
    assert file_crc32(tmp_path / "f")[0] == (tmp_path / "f").stat().st_size
    with DirectFile(tmp_path / "g") as g:
        g.write(b"123456789")
    assert g.crc32 == 0xCBF43926
    t = {"a": torch.arange(10, dtype=torch.float32), "b": torch.ones(3, dtype=torch.int64)}
    assert save_safetensors(t, tmp_path / "t.safetensors") == file_crc32(tmp_path / "t.safetensors")


@pytest.mark.parametrize("direct_io", [True, False])
def test_checksums_cover_every_file_and_verify(tiny_model, tmp_path, direct_io):
    path = save(tmp_path / "run", 1, tiny_model, "a", direct_io)
    record = json.loads((path / ckpt.CHECKSUM_FILE).read_text())
    on_disk = sorted(
        p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file() and p.name != ckpt.CHECKSUM_FILE
    )
    assert sorted(record["files"]) == on_disk and {"model.safetensors", ckpt.STATE_FILE} <= set(on_disk)
    for name, entry in record["files"].items():
        size, crc = file_crc32(path / name)
        assert entry == {"size": size, "crc32": f"{crc:08x}"}, name
    assert ckpt.verify_checkpoint(path) is None


def test_four_kib_of_ff_and_a_truncation_are_named(tiny_model, tmp_path):
    path = save(tmp_path / "run", 1, tiny_model, "a")
    weights = path / "model.safetensors"
    pristine = weights.read_bytes()
    assert len(pristine) > 3 * 4096
    with open(weights, "r+b") as f:  # the new user's corruption: 4 KiB of 0xff inside the tensor data
        f.seek(len(pristine) // 2)
        f.write(b"\xff" * 4096)
    problem = ckpt.verify_checkpoint(path)
    assert (
        problem is not None
        and problem.startswith("model.safetensors has CRC-32")
        and problem.endswith("recorded at save: its bytes changed")
    )
    weights.write_bytes(pristine[: len(pristine) // 2])
    problem = ckpt.verify_checkpoint(path)
    assert (
        problem
        == f"model.safetensors is {len(pristine) // 2} bytes, not the {len(pristine)} written: truncated or extended"
    )
    weights.write_bytes(pristine)
    assert ckpt.verify_checkpoint(path) is None
    state = (path / ckpt.STATE_FILE).read_bytes()
    (path / ckpt.STATE_FILE).write_bytes(state[:-1])
    assert (
        ckpt.verify_checkpoint(path)
        == f"{ckpt.STATE_FILE} is {len(state) - 1} bytes, not the {len(state)} written: truncated or extended"
    )
    (path / "tokenizer.json").unlink()  # files are checked in name order: tokenizer.json before trainer_state.pt
    assert ckpt.verify_checkpoint(path) == "tokenizer.json is missing"
    (path / ckpt.STATE_FILE).unlink()
    assert ckpt.verify_checkpoint(path) == f"{ckpt.STATE_FILE} is missing"


def test_a_checkpoint_without_checksums_gets_a_structural_check(tiny_model, tmp_path):
    """Checkpoints written before checksums existed: a truncated safetensors file is still recognised."""
    path = save(tmp_path / "run", 1, tiny_model, "a")
    (path / ckpt.CHECKSUM_FILE).unlink()
    assert ckpt.verify_checkpoint(path) is None
    weights = path / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[:-100])
    assert ckpt.verify_checkpoint(path) == (
        f"model.safetensors: {len(data) - 100} bytes, not the {len(data)} its header describes: truncated or extended"
    )
    weights.write_bytes(data[:5])
    assert ckpt.verify_checkpoint(path).startswith("model.safetensors: unreadable header")


def test_newest_intact_and_set_aside_keep_the_corrupt_one(tiny_model, tmp_path):
    run = tmp_path / "run"
    for step in (1, 2, 3):
        save(run, step, tiny_model, f"s{step}", keep_last=3)
    for step in (2, 3):
        (run / "checkpoints" / f"step-{step}" / "model.safetensors").write_bytes(b"\xff" * 4096)
    intact, corrupt = ckpt.newest_intact(run)
    assert intact.name == "step-1" and [p.name for p, _ in corrupt] == ["step-3", "step-2"]
    moved = ckpt.set_aside(corrupt[0][0])
    assert moved.name == "corrupt-step-3" and (moved / "model.safetensors").read_bytes() == b"\xff" * 4096
    assert [p.name for p in ckpt.checkpoints(run)] == ["step-1", "step-2"]
    ckpt.remove_partial(run)
    ckpt.prune(run, 1)
    assert moved.is_dir(), "a corrupt checkpoint set aside is never deleted"


class Crash(BaseException):
    """Stands for the process dying: nothing after it runs (see `snapshots`)."""


def test_a_crash_at_any_point_of_a_resave_leaves_one_complete_copy(tiny_model, tmp_path, monkeypatch):
    """Re-save step-1 with keep_last = 1 and record the checkpoint directory as it is on disk just before every
    os.replace (and at the end): what a kill at that moment leaves. From each, resume's cleanup (remove_partial)
    must leave step-1 complete and intact -- the old copy or the new one -- and nothing stale."""
    run = tmp_path / "run"
    save(run, 1, tiny_model, "old")
    real, snapshots = os.replace, []

    def replace(src, dst):
        snapshot = tmp_path / f"crash-{len(snapshots)}"
        shutil.copytree(run / "checkpoints", snapshot / "checkpoints")
        snapshots.append(snapshot)
        return real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    save(run, 1, tiny_model, "new")
    monkeypatch.undo()
    assert len(snapshots) >= 2, "a re-save renames twice"
    assert tag_of(run / "checkpoints" / "step-1") == "new"
    seen = set()
    for snapshot in snapshots:
        left = sorted(p.name for p in (snapshot / "checkpoints").iterdir())
        ckpt.remove_partial(snapshot)
        assert [p.name for p in ckpt.checkpoints(snapshot)] == ["step-1"], f"{snapshot.name}: left {left}"
        path = snapshot / "checkpoints" / "step-1"
        assert ckpt.verify_checkpoint(path) is None, snapshot.name
        assert not [p for p in (snapshot / "checkpoints").iterdir() if p.name.startswith(".")], snapshot.name
        seen.add(tag_of(path))
    assert seen == {"old"}, "until the new copy is in place, the old one is what a crash leaves"


@pytest.mark.parametrize("failing_call", [1, 2])
def test_a_failed_rename_during_a_resave_keeps_the_old_copy_in_place(tiny_model, tmp_path, monkeypatch, failing_call):
    """os.replace raising (EXDEV, EIO...) at the first or the second rename of a re-save: the error propagates,
    step-1 is the old complete copy at once (no cleanup needed), and no temporary directory is left."""
    run = tmp_path / "run"
    save(run, 1, tiny_model, "old")
    real, calls = os.replace, {"n": 0}

    def replace(src, dst):
        calls["n"] += 1
        if calls["n"] == failing_call:
            raise OSError(5, "Input/output error")
        return real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(OSError, match="Input/output"):
        save(run, 1, tiny_model, "new")
    monkeypatch.undo()
    assert [p.name for p in ckpt.checkpoints(run)] == ["step-1"] and tag_of(run / "checkpoints" / "step-1") == "old"
    assert ckpt.verify_checkpoint(run / "checkpoints" / "step-1") is None
    assert not [p for p in (run / "checkpoints").iterdir() if p.name.startswith(".")]
    assert load_file(run / "checkpoints" / "step-1" / "model.safetensors")
