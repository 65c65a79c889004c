"""LoRA through peft (`model.lora`, rank > 0): adapters on the policy, the reference, the sampler, checkpoints.

With LoRA the trained weights are W' = W + (alpha / r) B A for every adapted module (W frozen, A [r, in] and
B [out, r] trained; B starts at 0, so the run starts at the base model). Each part of a run uses that as follows:

- **policy**: `apply_lora` wraps the model with peft; only A and B require grad and go to the optimizer. A is drawn
  from a generator seeded with train.seed inside `torch.random.fork_rng`, so the global RNG is the same with and
  without LoRA.
- **reference** (beta > 0): `AdapterOff(policy)`, the same modules under peft's `disable_adapter()` -- the base model
  exactly, with no second copy of the weights (`make_reference`; `runnable` is what a forward pass runs).
- **sampler**: its own plain model holding W + (alpha / r) B A, written by name (`MergedWeights`, never merged into
  the trained model) after every update: no adapter matmuls while decoding, and exactly the weights an export holds.
- **checkpoints**: the adapter in peft's format plus the trainer state; `load_weights` restores it bitwise. The
  adapter config names its base model as the run does (`bundled:<alias>` stays an alias, independent of the cache).
- **loading and export**: `load_merged` reads an adapter checkpoint as a plain model (peft's `merge_and_unload` on a
  fresh copy): what `grpolab eval RUN` and `grpolab export RUN --merge` use.

peft is imported only when LoRA is used; a model can only be a PeftModel when peft was imported.
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path

import torch

from ..errors import ConfigError

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER = "default"  # peft's name of the one adapter a grpolab run trains


def is_lora(model) -> bool:
    """Whether `model` is a peft model (a LoRA policy)."""
    peft = sys.modules.get("peft")
    return peft is not None and isinstance(model, peft.PeftModel)


def is_adapter_dir(path: str | Path) -> bool:
    """A directory written by peft's save_pretrained (a LoRA checkpoint): an adapter config and no full model."""
    p = Path(path)
    return (p / ADAPTER_CONFIG).is_file() and not (p / "config.json").is_file()


# ----------------------------------------------------------------------------------------------- the policy


def base_model_name(model_cfg, model_path: str) -> str:
    """What the adapter config records as its base: the bundled alias as written, else the resolved path/hub id
    (a run directory given as model.name resolves to one fixed checkpoint)."""
    return model_cfg.name if model_cfg.name.startswith("bundled:") else model_path


def apply_lora(model, model_cfg, model_path: str, seed: int):
    """`model` with LoRA adapters of model.lora (unchanged when model.lora.rank == 0); see the module docstring.

    ConfigError naming model.lora.target_modules when peft finds no such module or an adapted weight is tied to
    another (a tied input/output embedding: merging it would change both)."""
    lc = model_cfg.lora
    if lc.rank == 0:
        return model
    import peft

    targets = lc.target_modules if isinstance(lc.target_modules, str) else list(lc.target_modules)
    config = peft.LoraConfig(
        r=lc.rank, lora_alpha=lc.alpha, lora_dropout=lc.dropout, target_modules=targets, task_type="CAUSAL_LM"
    )
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        torch.manual_seed(seed)  # A's initialisation: its own stream, the global RNG is restored on exit
        warnings.simplefilter("ignore", FutureWarning)  # peft asks transformers 5 a deprecated question
        warnings.filterwarnings("ignore", message=".*tie_word_embeddings.*")  # refused with one line just below
        try:
            wrapped = peft.get_peft_model(model, config)
        except ValueError as e:
            raise ConfigError(f"model.lora.target_modules: {str(e).splitlines()[0]}") from None
    _check_untied(wrapped)
    wrapped.peft_config[ADAPTER].base_model_name_or_path = base_model_name(model_cfg, model_path)  # peft sets the path
    return wrapped


def _adapted_layers(peft_model) -> dict[str, torch.nn.Module]:
    """{module name in the plain model: peft LoRA layer} of every adapted module."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    return {n: m for n, m in peft_model.get_base_model().named_modules() if isinstance(m, BaseTunerLayer)}


def _check_untied(peft_model) -> None:
    names: dict[int, list[str]] = {}
    for name, p in peft_model.get_base_model().named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    for layer_name, layer in _adapted_layers(peft_model).items():
        others = [n for n in names.get(id(layer.get_base_layer().weight), []) if not n.startswith(layer_name + ".")]
        if others:
            other = others[0].removesuffix(".weight").removesuffix(".base_layer")
            raise ConfigError(
                f"model.lora.target_modules: '{layer_name}' shares its weight with '{other}' (tied "
                f"embeddings); LoRA on a tied weight cannot be merged into one model -- leave it out"
            )


def trainable_parameters(model) -> list[torch.nn.Parameter]:
    """What the optimizer updates: every parameter that requires grad (all of them without LoRA)."""
    return [p for p in model.parameters() if p.requires_grad]


# ----------------------------------------------------------------------------------------------- the reference


class AdapterOff:
    """pi_ref of a LoRA policy: the policy with its adapters disabled -- the base model, no copy of any weight.

    Not a module of its own: run it through `runnable`, which enters peft's `disable_adapter()` for the pass."""

    def __init__(self, policy):
        self.policy = policy


@contextlib.contextmanager
def runnable(model) -> Iterator[torch.nn.Module]:
    """The module a forward pass of `model` runs: an AdapterOff's policy with adapters disabled for the duration
    (restored afterwards, even on an error), any other model as it is."""
    if not isinstance(model, AdapterOff):
        yield model
        return
    with model.policy.disable_adapter():
        yield model.policy


# ----------------------------------------------------------------------------------------------- merged weights


class MergedWeights(Mapping):
    """The tensors of a peft model by the names of the plain model it stands for:

        name.weight of an adapted module   ->  W + get_delta_weight  (= W + (alpha / r) B A), a new tensor
        any other parameter (and buffer)   ->  the model's own tensor (tied names map to the same object)

    Adapter tensors (lora_A, lora_B, ...) have no plain name and are left out. Merged values are computed on
    access under no_grad, one at a time, and never written into the peft model. ``merge=False``: the base model's
    tensors, W, under the same names (what a server that loads the adapter itself holds)."""

    def __init__(self, peft_model, buffers: bool = False, merge: bool = True):
        base = peft_model.get_base_model()
        self._layers = _adapted_layers(peft_model)
        if any(getattr(m, "merged", False) for m in self._layers.values()):
            raise ValueError("MergedWeights: the adapters are merged into the weights already")
        items = list(base.named_parameters(remove_duplicate=False))
        if buffers:
            items += list(base.named_buffers(remove_duplicate=False))
        self._tensors: dict[str, torch.Tensor] = {}
        self._delta: dict[str, torch.nn.Module] = {}
        for name, t in items:
            plain = self._plain_name(name)
            if plain is None:
                continue
            self._tensors[plain] = t
            layer = plain.removesuffix(".weight")
            if merge and plain.endswith(".weight") and layer in self._layers:
                self._delta[plain] = self._layers[layer]

    def _plain_name(self, name: str) -> str | None:
        parts = name.split(".")
        for i in range(len(parts) - 1, 0, -1):
            owner = ".".join(parts[:i])
            if owner in self._layers:
                if parts[i] != "base_layer":
                    return None  # an adapter tensor
                return ".".join(parts[:i] + parts[i + 1 :])
        return name

    def __getitem__(self, name: str) -> torch.Tensor:
        t = self._tensors[name]
        layer = self._delta.get(name)
        if layer is None:
            return t
        with torch.no_grad():
            merged = t.detach().clone()
            for adapter in layer.active_adapters:
                merged += layer.get_delta_weight(adapter).to(merged.dtype)
        return merged

    def __iter__(self):
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)


# ----------------------------------------------------------------------------------------------- checkpoints


def save_model(model, directory: Path) -> None:
    """save_pretrained into `directory`: a full HF model, or for LoRA the adapter only (peft format; the base
    embedding is never saved with it -- grpolab does not resize vocabularies -- so peft asks the hub nothing; peft's
    template model card, README.md, is left out)."""
    if is_lora(model):
        model.save_pretrained(directory, save_embedding_layers=False)
        (Path(directory) / "README.md").unlink(missing_ok=True)
    else:
        model.save_pretrained(directory)
