"""The ``model`` reward: a learned reward model scores (prompt, completion).

    reward:
      weights: {model: 1.0, correct: 0.0}          # correct at weight 0: logged beside it, never trained on
      model: {path: runs/my-rm, normalize: false, batch_size: 16, max_length: 512}

``reward.model.path`` is a Hugging Face sequence-classification model with one output (``num_labels = 1``): a hub id,
a local directory, ``bundled:<alias>`` (a causal LM whose new score head is untrained -- only useful as a backbone) or
a grpolab reward-model run directory (``grpolab rm train``; its ``model/``). The score of a completion is the head's
output at the last token of

    text = rm_tokenizer.apply_chat_template([{"role": "user", "content": render_prompt(problem)},
                                             {"role": "assistant", "content": completion}], tokenize=False)

(``prompt + "\\n" + completion`` for a tokenizer without a chat template): the same user turn the policy was shown,
the same rendering ``grpolab rm train`` trains on (``rm_text``). Batching cannot change a score: sequences are
truncated on the left to ``max_length`` tokens (the end of the completion, where the answer is, is always seen),
padded on the left, given position ids that count real tokens only, and scored at their last position -- so a
completion scores the same alone and in any batch (tested, up to float rounding).

``normalize: true`` z-scores the scores of each batch the trainer scores at once (one call of the reward: a step's
completions, or one refill round of dynamic sampling): ``(s - mean) / (std + 1e-6)`` with the population std, over
the finite scores (a NaN or infinite score makes only its own sample invalid). The
raw score is always logged as ``reward/model/raw`` (a per-step metric), which the release report reads.

The model runs on the run's device (``train.device``), in eval mode, under ``torch.no_grad``, loaded at the first
call (a bad path is a ConfigError naming ``reward.model.path`` when the run is built). It has no time limit: a forward
pass over at most ``batch_size x max_length`` tokens cannot hang, and abandoning a thread that holds the model (what
a time-out does, grpolab.rewards) would leave it running. Its weights, tokenizer and chat template are hashed into
the manifest (``reward_model``) and the settings shown on the objective card.
"""

from __future__ import annotations

import inspect
import math
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from ..errors import ConfigError, GrpolabError
from .code import Scored
from .spec import RewardSpec

MODEL_REWARD = "model"
RM_KIND = "reward_model"  # manifest["kind"] of a `grpolab rm train` run directory
RM_SUBDIR = "model"  # where such a run keeps its final model
NORM_EPS = 1e-6
FIELD = "reward.model.path"
TEMPLATE = (
    "rm tokenizer's chat template over [user: render_prompt(problem), assistant: completion]; left-truncated "
    "to max_length, left-padded, scored at the last token"
)


def is_rm_run(path: str | Path) -> bool:
    """Whether `path` is a run directory written by ``grpolab rm train``."""
    import json

    p = Path(path) / "manifest.json"
    try:
        return p.is_file() and json.loads(p.read_text(encoding="utf-8")).get("kind") == RM_KIND
    except (OSError, ValueError):
        return False


def resolve_rm_path(path: str) -> str:
    """Where the weights of reward model `path` are: a grpolab RM run's ``model/``, a bundled alias's converted
    checkpoint, else `path` (a local directory or a hub id); ConfigError naming reward.model.path otherwise."""
    if not isinstance(path, str) or not path.strip():
        raise ConfigError(
            f"{FIELD}: expected a reward model (hub id, local directory or `grpolab rm train` run "
            "directory) when reward.weights has `model`, got nothing"
        )
    if is_rm_run(path):
        model_dir = Path(path) / RM_SUBDIR
        if not (model_dir / "config.json").is_file():
            raise ConfigError(
                f"{FIELD}: {path} is a reward-model run without a finished model ({model_dir} has no "
                "config.json); the run did not complete"
            )
        return str(model_dir)
    if path.startswith("bundled:"):
        from ..models.load import resolve_model_path

        return resolve_model_path(path)
    p = Path(path)
    looks_local = path.startswith((".", "/", "~")) or p.exists() or path.count("/") > 1
    if looks_local and not (p / "config.json").is_file():
        raise ConfigError(f"{FIELD}: {path} is not a model directory (no config.json) nor a `grpolab rm train` run")
    return path


def rm_text(tokenizer, prompt: str, completion: str) -> str:
    """The text a reward model reads for (prompt, completion): module docstring."""
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}, {"role": "assistant", "content": completion}], tokenize=False
        )
    return f"{prompt}\n{completion}"


def encode(tokenizer, texts: Sequence[str], max_length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask) [B, L]: each text tokenised (no extra specials when a chat template rendered it),
    its last `max_length` tokens kept, left-padded with the pad token (eos when there is none)."""
    specials = not getattr(tokenizer, "chat_template", None)
    seqs = [tokenizer(t, add_special_tokens=specials)["input_ids"][-max_length:] for t in texts]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad if pad is not None else 0, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        if s:
            ids[i, width - len(s) :] = torch.tensor(s, dtype=torch.long)
            mask[i, width - len(s) :] = 1
    return ids, mask


def forward_scores(model, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """[B] scores of left-padded rows: the model's logits [B, L, 1] (or pooled [B, 1]) at the last position.

    Position ids count real tokens (cumsum(mask) - 1), so a row's score does not depend on its padding. A Hugging
    Face sequence-classification model pools at its rightmost non-pad token itself; with left padding that is the
    last position unless the text ends in the pad token, and the same token alone or batched."""
    kwargs: dict[str, Any] = {"input_ids": input_ids, "attention_mask": attention_mask}
    if "position_ids" in inspect.signature(model.forward).parameters:
        kwargs["position_ids"] = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(**kwargs).logits
    if logits.dim() == 3:
        logits = logits[:, -1]
    return logits[:, 0].float()


def normalize_scores(scores: Sequence[float], eps: float = NORM_EPS) -> list[float]:
    """Per-batch z-scores: z_i = (s_i - mean(s)) / (std(s) + eps), std the population standard deviation, mean and
    std over the finite scores only; a non-finite score (its sample invalid) is returned as it is.

    >>> normalize_scores([1.0, 3.0], eps=0.0)  # mean 2, population std 1
    [-1.0, 1.0]
    >>> normalize_scores([5.0, 5.0])  # no spread: all 0, never a division by zero
    [0.0, 0.0]
    >>> normalize_scores([1.0, float("nan"), 3.0], eps=0.0)
    [-1.0, nan, 1.0]
    """
    finite = [s for s in scores if math.isfinite(s)]
    if not finite:
        return list(scores)
    mean = sum(finite) / len(finite)
    std = math.sqrt(sum((s - mean) ** 2 for s in finite) / len(finite))
    return [(s - mean) / (std + eps) if math.isfinite(s) else s for s in scores]


def load_reward_model(path: str, device: str | torch.device = "cpu"):
    """(model, tokenizer) of the reward model at `path` (resolve_rm_path), in eval mode on `device`."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    where = resolve_rm_path(path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(where)
        model = AutoModelForSequenceClassification.from_pretrained(where, num_labels=1)
    except (OSError, ValueError) as e:
        raise GrpolabError(
            f"{FIELD}: cannot load a sequence-classification model from {path!r} ({str(e).splitlines()[0]})"
        ) from None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    return model.to(device).eval(), tokenizer


class ModelReward:
    """The batched reward ``(completions, problems) -> [Scored]`` of one reward model (module docstring).

    ``model`` / ``tokenizer`` may be given directly (tests plant deterministic ones); otherwise they are loaded
    from ``options["path"]`` at the first call."""

    def __init__(
        self, options: Mapping[str, Any], device: str | torch.device | None = None, model=None, tokenizer=None
    ):
        self.path = str(options.get("path", "") or "")
        self.normalize = bool(options.get("normalize", False))
        self.batch_size = int(options.get("batch_size", 16))
        self.max_length = int(options.get("max_length", 512))
        self.device = torch.device(device or "cpu")
        self.model, self.tokenizer = model, tokenizer
        if model is None:
            resolve_rm_path(self.path)  # a bad path fails when the run is built, before any model is loaded

    def _loaded(self):
        if self.model is None:
            self.model, self.tokenizer = load_reward_model(self.path, self.device)
        return self.model, self.tokenizer

    @torch.no_grad()
    def raw_scores(self, prompts: Sequence[str], completions: Sequence[str]) -> list[float]:
        """The reward model's score of every (prompt, completion), batch_size sequences per forward pass."""
        model, tok = self._loaded()
        texts = [rm_text(tok, p, c) for p, c in zip(prompts, completions)]
        out: list[float] = []
        for i in range(0, len(texts), self.batch_size):
            ids, mask = encode(tok, texts[i : i + self.batch_size], self.max_length)
            out += forward_scores(model, ids.to(self.device), mask.to(self.device)).cpu().tolist()
        return out

    def __call__(self, completions: Sequence[str], problems: Sequence[Any]) -> list[Scored]:
        from ..tasks import render_prompt

        raw = self.raw_scores([render_prompt(p) for p in problems], completions)
        values = normalize_scores(raw) if self.normalize else raw
        return [
            Scored(v, extras={"model/raw": r})
            if math.isfinite(r)
            else Scored(None, error=f"the reward model returned {r}")
            for v, r in zip(values, raw)
        ]


def model_reward_spec(options: Any, device: Any = None):
    """The RewardSpec of the `model` reward for config section reward.model (a dataclass or a mapping)."""
    opts = _as_mapping(options)
    reward = ModelReward(opts, device)
    return RewardSpec(
        lambda completion, problem: reward([completion], [problem])[0],
        f"learned reward model {reward.path} (normalize={reward.normalize})",
        time_limit_s=None,
        takes_problem=True,
        batch=reward,
    )


def _as_mapping(options: Any) -> dict[str, Any]:
    import dataclasses

    if options is None:
        return {}
    return dataclasses.asdict(options) if dataclasses.is_dataclass(options) else dict(options)


NORMALIZATION = "per-batch z-score (s - mean) / (std + 1e-6)"  # reward.model.normalize


def reward_model_record(options: Any) -> dict[str, Any]:
    """What the manifest and the objective card record of a run's reward model: path, where it resolved to, the
    sha256 of its weights, tokenizer and chat template (None for a hub id not on disk), the template rule and the
    scoring settings."""
    from ..manifest import hash_model_dir, sha256_bytes

    opts = _as_mapping(options)
    where = resolve_rm_path(str(opts.get("path", "")))
    hashes = hash_model_dir(where)
    template = None
    try:
        import json

        cfg = json.loads((Path(where) / "tokenizer_config.json").read_text(encoding="utf-8"))
        template = cfg.get("chat_template") or (
            (Path(where) / "chat_template.jinja").read_text(encoding="utf-8")
            if (Path(where) / "chat_template.jinja").is_file()
            else ""
        )
    except (OSError, ValueError):
        pass
    return {
        "path": opts.get("path"),
        "resolved": where,
        "weights": hashes["weights"],
        "tokenizer": hashes["tokenizer"],
        "chat_template": sha256_bytes(template.encode()) if isinstance(template, str) else None,
        "template": TEMPLATE,
        "normalize": bool(opts.get("normalize", False)),
        "normalization": NORMALIZATION if opts.get("normalize") else "none (raw score)",
        "batch_size": opts.get("batch_size"),
        "max_length": opts.get("max_length"),
    }


def weighted(weights: Mapping[str, Any] | None) -> bool:
    """Whether reward.weights names the `model` reward (at any weight: it is then scored and logged)."""
    return MODEL_REWARD in (weights or {})


def reward_model_manifest(cfg: Any) -> dict[str, Any] | None:
    """The manifest's ``reward_model`` record of a run config (reward_model_record), None without the `model` reward."""
    return reward_model_record(cfg.reward.model) if weighted(cfg.reward.weights) else None


def reward_model_hashes(record: dict[str, Any] | None) -> dict[str, Any]:
    """The reward model's entries of the manifest's ``hashes`` (none without one)."""
    if not record:
        return {}
    return {
        "reward_model_weights": record["weights"],
        "reward_model_tokenizer": record["tokenizer"],
        "reward_model_chat_template": record["chat_template"],
    }


def reward_model_card(cfg: Any) -> dict[str, Any]:
    """The objective card's ``reward_model`` entry when the reward includes `model`: what the config says (no file is
    read; the weights' hashes are the manifest's ``reward_model`` record, reward_model_manifest)."""
    if not weighted(cfg.reward.weights):
        return {}
    opts = _as_mapping(cfg.reward.model)
    return {
        "reward_model": {
            "path": opts.get("path"),
            "template": TEMPLATE,
            "normalize": bool(opts.get("normalize", False)),
            "normalization": NORMALIZATION if opts.get("normalize") else "none (raw score)",
            "batch_size": opts.get("batch_size"),
            "max_length": opts.get("max_length"),
        }
    }
