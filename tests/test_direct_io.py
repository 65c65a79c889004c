"""Checkpoint files written past the page cache (grpolab/models/direct_io.py): the same bytes as the usual writers,
whichever way the file ends up written, and checkpoints that load as before."""

from __future__ import annotations

import errno
import filecmp
import json
import os
import random

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import grpolab.models.checkpoint as ckpt
from grpolab.models import direct_io
from grpolab.models.direct_io import ALIGN, DirectFile, save_safetensors, torch_save


@pytest.fixture
def small_buffer(monkeypatch):
    """A 3-block buffer, so a few kilobytes cross several buffer writes."""
    monkeypatch.setattr(direct_io, "BUFFER_BYTES", 3 * ALIGN)
    return 3 * ALIGN


@pytest.mark.parametrize("direct", [True, False])
@pytest.mark.parametrize("size_in_buffers", [0, 1 / 3 / ALIGN, 1 / 3, 1, 1 + 1 / 3 / ALIGN, 2.5])
def test_the_file_holds_exactly_the_bytes_written_in_any_split(tmp_path, small_buffer, direct, size_in_buffers):
    """Sizes at and around the alignment and the buffer's size, written in random pieces: the file is those bytes,
    no padding left behind, whether it was written directly or through the page cache."""
    size = int(size_in_buffers * small_buffer) + (1 if size_in_buffers == 1 / 3 else 0)  # 4097: one byte past a block
    rng = random.Random(size)
    data = bytes(rng.getrandbits(8) for _ in range(size))
    path = tmp_path / "f.bin"
    with DirectFile(path, direct) as f:
        at = 0
        while at < size:
            n = rng.randint(1, 2 * ALIGN)
            assert f.write(data[at : at + n]) == len(data[at : at + n])
            at += n
    assert path.read_bytes() == data
    assert f.size == size
    if not direct:
        assert not f.direct


def test_a_filesystem_refusing_direct_io_at_open_gets_the_same_bytes(tmp_path, small_buffer, monkeypatch):
    real_open = os.open

    def no_direct(path, flags, *args):
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args)

    monkeypatch.setattr(direct_io.os, "open", no_direct)
    data = os.urandom(small_buffer + 100)
    with DirectFile(tmp_path / "f.bin") as f:
        f.write(data)
    assert not f.direct and (tmp_path / "f.bin").read_bytes() == data


@pytest.mark.parametrize("refused_at", [0, 1], ids=["first write", "second buffer"])
def test_a_filesystem_refusing_direct_writes_goes_on_buffered(tmp_path, small_buffer, monkeypatch, refused_at):
    """O_DIRECT accepted at open but a write refused (EINVAL), the first or a later one after half of its bytes
    reached the disk: the file goes on through the page cache from that buffer's offset, with the same bytes."""
    if not hasattr(os, "O_DIRECT"):
        pytest.skip("no O_DIRECT on this platform")
    real_pwrite = os.pwrite
    calls = {"direct": 0, "refused": 0}

    def refuse_direct(fd, view, offset):
        if not fcntl_direct(fd):
            return real_pwrite(fd, view, offset)
        calls["direct"] += 1
        if calls["direct"] == refused_at + 1:
            real_pwrite(fd, view[: len(view) // 2], offset)  # part of it lands, then the refusal
            calls["refused"] += 1
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_pwrite(fd, view, offset)

    monkeypatch.setattr(direct_io.os, "pwrite", refuse_direct)
    data = os.urandom(3 * small_buffer + 5)
    f = DirectFile(tmp_path / "f.bin")
    if not f.direct:
        pytest.skip("this filesystem refuses O_DIRECT at open (covered by the test above)")
    with f:
        f.write(data)
    assert calls["refused"] == 1 and not f.direct and (tmp_path / "f.bin").read_bytes() == data


def test_short_writes_are_completed_and_a_write_of_nothing_is_an_error(tmp_path, small_buffer, monkeypatch):
    real_pwrite = os.pwrite
    monkeypatch.setattr(direct_io.os, "pwrite", lambda fd, view, offset: real_pwrite(fd, view[:ALIGN], offset))
    data = os.urandom(2 * small_buffer + 7)
    with DirectFile(tmp_path / "f.bin") as f:
        f.write(data)
    assert (tmp_path / "f.bin").read_bytes() == data
    monkeypatch.setattr(direct_io.os, "pwrite", lambda fd, view, offset: 0)
    with pytest.raises(OSError, match="wrote nothing"):
        with DirectFile(tmp_path / "g.bin") as f:
            f.write(data)


def fcntl_direct(fd: int) -> bool:
    import fcntl

    return bool(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT)


def test_a_failed_write_closes_the_file_and_raises(tmp_path, small_buffer, monkeypatch):
    real_pwrite = os.pwrite
    calls = {"n": 0}

    def full_disk(fd, view, offset):
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_pwrite(fd, view, offset)

    monkeypatch.setattr(direct_io.os, "pwrite", full_disk)
    with pytest.raises(OSError, match="No space"):
        with DirectFile(tmp_path / "f.bin") as f:
            f.write(os.urandom(3 * small_buffer))
    assert f._fd == -1  # released, not left open


def test_safetensors_bytes_equal_the_librarys(tmp_path, small_buffer):
    """Every dtype, a 0-d, an empty and a non-contiguous tensor, with metadata: the file is byte for byte what
    safetensors' save_file writes, and safetensors reads it back."""
    g = torch.Generator().manual_seed(0)
    base = torch.randn(6, 5, generator=g)
    tensors = {
        "w.f32": torch.randn(7, 3, generator=g),
        "w.bf16": torch.randn(4, 9, generator=g).bfloat16(),
        "w.f16": torch.randn(5, generator=g).half(),
        "w.f64": torch.randn(2, 2, generator=g).double(),
        "ids": torch.arange(11),
        "i32": torch.arange(3, dtype=torch.int32),
        "i8": torch.tensor([-3, 4], dtype=torch.int8),
        "u8": torch.tensor([200, 1], dtype=torch.uint8),
        "flags": torch.tensor([True, False, True]),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 4),
        "transposed": base.t(),
        "poids.é": torch.ones(2),
    }
    ours, theirs = tmp_path / "ours.safetensors", tmp_path / "theirs.safetensors"
    save_safetensors(tensors, ours, {"format": "pt"})
    save_file({k: v.contiguous() for k, v in tensors.items()}, theirs, metadata={"format": "pt"})
    assert filecmp.cmp(ours, theirs, shallow=False)
    back = load_file(ours)
    assert set(back) == set(tensors)
    for name, t in tensors.items():
        assert back[name].dtype == t.dtype and torch.equal(back[name], t), name
    with safe_open(ours, "pt") as f:
        assert f.metadata() == {"format": "pt"}


def test_a_dtype_it_does_not_list_is_written_by_the_library(tmp_path):
    tensors = {"c": torch.randn(3, dtype=torch.complex64), "u16": torch.arange(4).to(torch.uint16), "w": torch.randn(2)}
    save_safetensors(tensors, tmp_path / "ours.safetensors", {"format": "pt"})
    save_file(tensors, tmp_path / "theirs.safetensors", metadata={"format": "pt"})
    assert filecmp.cmp(tmp_path / "ours.safetensors", tmp_path / "theirs.safetensors", shallow=False)


def test_torch_save_through_it_loads_the_same_state(tmp_path, small_buffer):
    g = torch.Generator().manual_seed(1)
    state = {
        "step": 3,
        "optimizer": {
            "state": {0: {"exp_avg": torch.randn(100, 7, generator=g), "step": torch.tensor(3.0)}},
            "param_groups": [{"lr": 1e-5}],
        },
        "rng": torch.get_rng_state(),
        "name": "x" * 5000,
    }
    torch_save(state, tmp_path / "state.pt")
    back = torch.load(tmp_path / "state.pt", weights_only=False)
    assert back["step"] == 3 and back["name"] == state["name"] and torch.equal(back["rng"], state["rng"])
    assert torch.equal(back["optimizer"]["state"][0]["exp_avg"], state["optimizer"]["state"][0]["exp_avg"])


def tiny_mixtral():
    """A mixture-of-experts model built from a config: transformers fuses its experts at runtime and
    save_pretrained writes them back one by one (a weight conversion to revert)."""
    from transformers import MixtralConfig, MixtralForCausalLM

    torch.manual_seed(0)
    return MixtralForCausalLM(
        MixtralConfig(
            vocab_size=64,
            hidden_size=16,
            intermediate_size=24,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_local_experts=3,
            num_experts_per_tok=2,
            max_position_embeddings=64,
        )
    )


@pytest.mark.parametrize("which", ["tied llama from disk", "mixtral from a config"])
def test_a_checkpoint_written_directly_equals_one_written_by_save_pretrained(tiny_model_dir, tmp_path, which):
    """Same tensor names and values in model.safetensors (tied heads left out, fused experts written back one by
    one, as save_pretrained does), the same config files (dtype and architectures set), the same trainer state;
    transformers loads it as the same model."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = (
        AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
        if which.startswith("tied")
        else tiny_mixtral()
    )
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    state = {"step": 1, "moments": torch.randn(33, generator=torch.Generator().manual_seed(2))}
    written = {}
    for direct in (True, False):
        run = tmp_path / f"direct-{direct}"
        written[direct] = ckpt.save_checkpoint(run, 1, model, tokenizer, state, keep_last=1, direct_io=direct)
    a, b = written[True], written[False]
    assert sorted(p.name for p in a.iterdir()) == sorted(p.name for p in b.iterdir())
    for name in ("config.json", "generation_config.json"):
        assert json.loads((a / name).read_text()) == json.loads((b / name).read_text()), name
    ours, theirs = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    assert set(ours) == set(theirs) and all(torch.equal(ours[k], theirs[k]) for k in ours)
    assert torch.equal(ckpt.load_state(a)["moments"], state["moments"])
    reloaded = AutoModelForCausalLM.from_pretrained(a, dtype=torch.float32)
    assert list(reloaded.state_dict()) == list(model.state_dict())
    for (name, p), q in zip(model.state_dict().items(), reloaded.state_dict().values()):
        assert torch.equal(p, q), name
