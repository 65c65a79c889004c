"""One typed, frozen config tree, loaded from YAML plus ``--set a.b=value`` overrides.

Validation names the field path and what was expected (``algorithm.beta: expected a number >= 0, got -1``);
unknown fields get a "did you mean". ``algorithm.preset`` expands into explicit fields (presets.py) before the
user's own algorithm fields are applied on top, so the resolved config is always fully explicit.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import logging
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from .algo.advantages import Baseline, Scaling, StdKind
from .algo.aggregation import Aggregation
from .algo.importance import ISMode, ISReject
from .algo.kl import KLEstimator, KLPlacement
from .algo.surrogate import Surrogate
from .errors import ConfigError
from .presets import PRESETS

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoraConfig:
    """LoRA adapters through peft (grpolab/models/lora.py): W' = W + (alpha / rank) B A on every targeted module."""

    rank: int = 0  # r; 0 = off (full fine-tuning)
    alpha: float = 16.0  # scaling = alpha / rank
    dropout: float = 0.0  # on the adapters' input, training passes only (old/reference passes run in eval mode)
    target_modules: str | list = "all-linear"  # "all-linear" (every linear layer but the output head) or module names


@dataclass(frozen=True)
class ModelConfig:
    name: str = "bundled:smollm2-135m-instruct"  # hub id, local path, or bundled: alias
    dtype: Literal["float32", "bfloat16"] = "float32"  # master weights
    lora: LoraConfig = LoraConfig()


@dataclass(frozen=True)
class TaskConfig:
    name: str = "arithmetic"
    options: dict = field(default_factory=dict)  # constructor arguments of the task (tasks/__init__.py)


@dataclass(frozen=True)
class RewardModelConfig:
    """The `model` reward's reward model (grpolab/rewards/model.py; docs/reward_models.md)."""

    path: str = ""  # hub id, local directory or `grpolab rm train` run directory
    normalize: bool = False  # z-score the scores of each scored batch
    batch_size: int = 16  # sequences per forward pass
    max_length: int = 512  # tokens kept (the last ones) of each (prompt, completion) text


@dataclass(frozen=True)
class JudgeConfig:
    """The `judge` reward's LLM judge (grpolab/rewards/judge.py; docs/judges.md)."""

    model: str = ""  # local: hub id, local directory or bundled: alias; with endpoint: the served model's name
    endpoint: str = ""  # OpenAI-compatible base URL (e.g. http://127.0.0.1:8000/v1); "" = run the model locally
    api_key_env: str = ""  # environment variable holding the endpoint's API key ("" = none sent)
    rubric: str = ""  # rubric template file: {question}, {answer} (group: {answers}), optional {reference}
    parse: Literal["tag", "json", "yes_no"] = "tag"  # <score>N</score> | JSON {"score": N} | P(yes) (local only)
    mode: Literal["pointwise", "group"] = "pointwise"  # each answer alone | the G answers of a prompt together
    min_score: float = 0.0  # the rubric's scale: reward = (score - min_score) / (max_score - min_score)
    max_score: float = 10.0
    min_yes_no_mass: float = 0.5  # yes_no: P(yes) + P(no) below this = the judge did not answer yes/no (invalid)
    temperature: float = 0.0  # endpoint sampling (a local judge decodes greedily)
    max_new_tokens: int = 64  # the judge's reply (tag / json)
    dtype: Literal["float32", "bfloat16"] = "float32"  # a local judge's weights
    batch_size: int = 8  # local: prompts per forward pass; endpoint: requests in flight
    time_limit_s: float = 30.0  # endpoint: one judgement, its retries included
    retries: int = 3  # endpoint: retries of 408 / 429 / 5xx / connection errors (Retry-After honoured)
    cache: str = "auto"  # auto (grpolab cache dir) | off | a file path (SQLite)


@dataclass(frozen=True)
class RewardConfig:
    weights: dict = field(default_factory=lambda: {"correct": 1.0, "format": 0.1})
    functions: dict = field(
        default_factory=dict
    )  # your own: {name: "path/file.py:fn" | "pkg.mod:fn"} (rewards/user.py)
    time_limit_s: float = 5.0  # per call of each of your functions (the built-ins have their own)
    sandbox: dict = field(default_factory=dict)  # limits of the code rewards' sandbox (grpolab/sandbox/limits.py)
    model: RewardModelConfig = RewardModelConfig()  # the learned reward `model` (weights: {model: 1.0})
    judge: JudgeConfig = JudgeConfig()  # the LLM judge `judge` (weights: {judge: 1.0})


@dataclass(frozen=True)
class RolloutConfig:
    # grpolab's decode loop (rollout/decode.py); hf: HF generate (the removed choices: REMOVED_CHOICES)
    decoder: Literal["grpolab", "hf"] = "grpolab"
    group_size: int = 8  # G completions per prompt
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    max_new_tokens: int = 64
    # what else ends a completion (rollout/stop.py): code_block = the closing fence of its first Python block (what a
    # code reward reads); auto = code_block when a code reward (all_pass / pass_fraction) is weighted, else none
    stop_rule: Literal["auto", "none", "code_block"] = "auto"
    # the sampler's own weight copy, synced after each update; auto = measured at start (grpolab/training/precision.py)
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"


@dataclass(frozen=True)
class AlgorithmConfig:
    """The objective's choices. These field defaults are the one definition of the algorithm defaults (DeepSeekMath
    GRPO, the ``grpo`` preset); presets.py writes each other preset as its differences from them, and algo/'s
    parameter classes have no defaults of their own (the trainer fills them from here)."""

    preset: Literal["grpo", "dapo", "dr_grpo", "rloo", "gspo", "cispo", "gmpo", "sapo", "icepop", "scalerl"] = "grpo"
    baseline: Baseline = Baseline.GROUP_MEAN
    scaling: Scaling = Scaling.GROUP_STD
    std_kind: StdKind = StdKind.SAMPLE
    adv_eps: float = 1e-6
    surrogate: Surrogate = Surrogate.PPO_CLIP
    eps_low: float = 0.2
    eps_high: float = 0.2
    dual_clip_c: float = 3.0
    # cispo: the detached IS weight clipped to [1 - cispo_eps_low, 1 + cispo_eps_high] (1.0: no lower bound, as
    # MiniMax-M1; upper 5 = the eps_max TRL recommends for ScaleRL)
    cispo_eps_low: float = 1.0
    cispo_eps_high: float = 4.0
    sapo_tau_pos: float = 1.0  # sapo: gate temperature where A > 0 ...
    sapo_tau_neg: float = 1.05  # ... and where A <= 0 (TRL's and verl's defaults)
    # clip_cov / kl_cov: share of a micro-batch's tokens selected by covariance; clip_cov's covariance bounds; kl_cov's
    # coefficient of |log r| (verl's defaults)
    cov_ratio: float = 2e-4
    clip_cov_lb: float = 1.0
    clip_cov_ub: float = 5.0
    kl_cov_coef: float = 0.1
    aggregation: Aggregation = Aggregation.SEQ_MEAN_TOKEN_MEAN
    l_max: int = 0  # constant of seq_mean_token_sum_norm; 0 = rollout.max_new_tokens
    beta: float = 0.04
    kl_estimator: KLEstimator = KLEstimator.K3
    kl_placement: KLPlacement = KLPlacement.LOSS
    is_mode: ISMode = ISMode.NONE
    is_c_max: float = 2.0
    is_c_min: float = 0.5
    # sequence rejection, orthogonal to is_mode: geometric = the geometric mean of pi_old / q over the sequence
    # outside [is_reject_lo, is_reject_hi] (verl's geo_rs bounds)
    is_reject: ISReject = ISReject.NONE
    is_reject_lo: float = 0.999
    is_reject_hi: float = 1.001
    # DeepSeek-V3.2 off-policy sequence masking: a sequence with A < 0 whose mean_t (log q - log pi_theta) exceeds
    # this gets no policy gradient (0 = off)
    offpolicy_mask_delta: float = 0.0
    entropy_coef: float = 0.0
    mask_truncated: bool = False  # drop truncated completions from the loss
    overlong_buffer: int = 0  # DAPO soft overlong punishment: length buffer (0 = off)
    overlong_penalty: float = 1.0  # ... and its maximum penalty
    dynamic_sampling: bool = False  # DAPO: drop zero-variance groups and refill
    max_extra_rounds: int = 0  # refill budget (extra generation rounds per step)
    # advantage estimator: group-relative (GRPO family), pass_at_k = the group's unbiased pass@k gain per sample
    # (grpolab/algo/advantages.py; pass_k, pass_threshold), or gae = PPO with a learned critic (grpolab/baselines/ppo.py)
    # distill = on-policy distillation from distill.teacher (grpolab/training/distill.py)
    estimator: Literal["group", "pass_at_k", "gae", "distill"] = "group"
    pass_k: int = 4  # pass_at_k: the k of pass@k (1 <= k < rollout.group_size)
    pass_threshold: float = 1.0  # pass_at_k: a completion passes when its reward is >= this
    # periodic reference reset (ProRL): every N steps the reference model <- the current policy (0 = never); with
    # ref_reset_optimizer the optimizer's moments are cleared at the same time
    ref_reset_every: int = 0
    ref_reset_optimizer: bool = False
    gamma: float = 1.0  # gae: discount
    lam: float = 0.95  # gae: lambda
    whiten: bool = True  # gae: whiten the per-token advantages over the batch


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 20
    prompts_per_step: int = 4
    mu: int = 1  # passes over each rollout batch
    minibatches: int = 1  # optimizer steps per pass
    micro_batch_size: int = 8  # sequences per forward/backward (gradient accumulation inside a minibatch)
    lr: float = 1e-6
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.99
    warmup_steps: int = 0
    schedule: Literal["constant", "cosine"] = "constant"
    min_lr_ratio: float = 0.0
    grad_clip: float = 1.0
    # bf16 = bfloat16 autocast over fp32 master weights; auto = measured at start (grpolab/training/precision.py)
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    device: str = "auto"  # auto (cuda when available) | cpu | cuda | cuda:N; under torchrun on CUDA: cuda:LOCAL_RANK
    strategy: Literal["ddp", "fsdp2"] = (
        "ddp"  # data parallel: replicated weights, or sharded (grpolab/training/sharding.py)
    )
    seed: int = 0
    # same config + seed on the same machine, threads and versions => the same bytes (grpolab/training/reproducibility.py:
    # deterministic algorithms; on CPU the training passes' attention through SDPA's math backend)
    deterministic: bool = True
    save_every: int = 0  # checkpoint every N steps (0 = off) ...
    save_every_minutes: float = (
        10.0  # ... and/or after this many minutes since the last one (0 = off); always at the end
    )
    keep_last: int = 2
    samples_per_step: int = 4
    max_nonfinite_steps: int = 3  # stop after this many consecutive steps with a NaN/Inf loss or gradient
    # prompt order (grpolab/training/prompt_sampler.py): shuffle = each prompt once per epoch; pass_rate = prompts whose last
    # group was solved G/G or 0/G are skipped except with probability prompt_floor (and after ceil(1/floor) skips)
    prompt_schedule: Literal["shuffle", "pass_rate"] = "shuffle"
    prompt_floor: float = 0.25


@dataclass(frozen=True)
class SpeedConfig:
    """How fast a run computes, never what it optimises: each switch keeps the objective, the data and the sampler's
    distribution as they are (some sum the same numbers in another order). `grpolab manifest diff` lists them apart
    from the differences that matter, a resume accepts a change of them (recorded; the bitwise claim is downgraded),
    and each one's measured effect is in docs/performance.md."""

    # grpolab decoder on a CPU, float32 (or bfloat16 where the CPU has bf16 units): weights packed once per decode call
    # for oneDNN (rollout/prepack.py); false = every product re-packs its weight
    cpu_fast_paths: bool = True
    # grpolab decoder: the KV cache written in place into buffers allocated once per decode call for prompt +
    # max_new_tokens (rollout/cache.py); false = transformers' default, a concatenation per step
    preallocate_kv_cache: bool = True
    # with bf16 on CPU: attention in float32 (its bf16 backward is slow; grpolab/training/attention.py)
    attention_fp32: bool = True
    share_prompt: bool = True  # training passes run each prompt once per micro-batch, not once per completion
    pack_completions: bool = True  # with share_prompt: completions packed end to end, not padded (SDPA models)
    fused_adamw: bool = True  # torch's fused AdamW kernel (same update as foreach, one pass over the weights)
    keep_freed_memory: bool = True  # CPU: malloc keeps freed memory for reuse (grpolab/training/cpu_memory.py)
    checkpoint_direct_io: bool = True  # write checkpoints past the page cache, O_DIRECT (grpolab/models/direct_io.py)


# Where each speed switch lived before it moved to `speed:`; a config or recorded manifest that still sets one
# there is read as the new field, with a warning (move_speed_fields).
SPEED_FIELDS_MOVED = {
    "cpu_fast_paths": "rollout",
    "preallocate_kv_cache": "rollout",
    "attention_fp32": "train",
    "share_prompt": "train",
    "pack_completions": "train",
    "fused_adamw": "train",
    "keep_freed_memory": "train",
    "checkpoint_direct_io": "train",
}


@dataclass(frozen=True)
class DistillConfig:
    """On-policy distillation (algorithm.estimator = distill): the student samples, the teacher scores the student's
    tokens, and each token's advantage is the negative reverse KL, log pi_teacher - log pi_student, optionally
    mixed with the group advantage of the task reward."""

    teacher: str = ""  # hub id, local path, bundled: alias or a `grpolab train` run directory; same tokenizer
    reward_weight: float = 0.0  # A_it = (log pi_T - log pi_old)(o_it) + reward_weight * A_i
    dtype: Literal["float32", "bfloat16"] = "float32"  # the teacher's weights


@dataclass(frozen=True)
class CriticConfig:
    """The value model of algorithm.estimator = gae (grpolab/baselines/critic.py); trained for train.mu x train.minibatches
    steps per batch, like the policy."""

    share_backbone: bool = False  # False: value head on a copy of the policy's backbone; True: on the policy's own
    lr: float = 1e-5
    value_clip: float = 0.2  # clip of V - V_old in the value loss (0 = off)
    grad_clip: float = 1.0


@dataclass(frozen=True)
class EvalConfig:
    every_steps: int = 0  # periodic held-out eval during training (0 = off)
    num_problems: int = 64
    split: str = "test"
    max_new_tokens: int = 0  # 0 = rollout.max_new_tokens
    batch_size: int = 64


@dataclass(frozen=True)
class RunConfig:
    output_dir: str = "runs"
    name: str = ""  # "" = <task>-<preset>-<timestamp>
    # experiment trackers fed beside metrics.jsonl (grpolab/training/trackers.py; docs/tracking.md): any of
    # tensorboard, wandb (offline), mlflow; each needs its extra (pip install 'grpolab[tensorboard]' ...)
    report_to: list = field(default_factory=list)
    mlflow_tracking_uri: str = ""  # "" = a local SQLite store under RUN_DIR/mlflow (mlflow ui --backend-store-uri ...)
    table_every_steps: int = 0  # a completions table to the trackers every N steps (0 = off)
    table_groups: int = 4  # groups per table (all their completions), zero-variance groups included


@dataclass(frozen=True)
class Config:
    model: ModelConfig = ModelConfig()
    task: TaskConfig = TaskConfig()
    reward: RewardConfig = RewardConfig()
    rollout: RolloutConfig = RolloutConfig()
    algorithm: AlgorithmConfig = AlgorithmConfig()
    train: TrainConfig = TrainConfig()
    speed: SpeedConfig = SpeedConfig()
    distill: DistillConfig = DistillConfig()
    eval: EvalConfig = EvalConfig()
    critic: CriticConfig = CriticConfig()
    run: RunConfig = RunConfig()

    @property
    def l_max(self) -> int:
        return self.algorithm.l_max or self.rollout.max_new_tokens


# ----------------------------------------------------------------------------------------------- building


def _expected(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if isinstance(tp, type) and issubclass(tp, str) and tp is not str:
        return "one of " + ", ".join(repr(m.value) for m in tp)  # StrEnum
    return {int: "an integer", float: "a finite number", bool: "true or false", str: "a string", dict: "a mapping"}.get(
        tp, str(tp)
    )


def _yaml_float(value: Any) -> Any:
    """YAML 1.1 reads 1e-5 (no dot) as a string; accept it as the number every user means."""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def _coerce(path: str, tp: Any, value: Any) -> Any:
    origin = typing.get_origin(tp)
    if origin is Literal:
        ok = value in typing.get_args(tp)
    elif isinstance(tp, type) and issubclass(tp, str) and tp is not str:
        ok = isinstance(value, str) and value in {m.value for m in tp}
        value = tp(value) if ok else value
    elif tp is float:  # a finite number: inf / nan (YAML .inf, --set x=inf) would train on NaN weights
        value = _yaml_float(value)
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        value = float(value) if ok else value
    elif tp is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif tp in (bool, str, dict):
        ok = isinstance(value, tp)
        if ok and path in NUMBER_MAPS:
            value = number_map(path, value)
    elif origin in (typing.Union, types.UnionType):
        ok = True
    else:
        ok = True
    if not ok:
        removed = REMOVED_CHOICES.get((path, value), "") if isinstance(value, str) else ""
        raise ConfigError(f"{path}: expected {_expected(tp)}, got {value!r}{removed and f' ({removed})'}")
    return value


REMOVED_CHOICES = {  # (field, value) of a choice grpolab no longer has -> why, named in the error
    ("rollout.decoder", value): f"the {value!r} decoder was removed: it sampled the same tokens as 'grpolab' and was "
    "no faster in a GRPO step (docs/performance.md keeps its measurement); use 'grpolab'"
    for value in ("static", "static_compiled")
}


NUMBER_MAPS = ("reward.weights",)  # mapping fields whose values are numbers (names -> weight)


def number_map(path: str, value: dict, sep: str = ".") -> dict:
    """{name: finite number} with YAML 1.1's string numbers ('1e-3') read as numbers; else a ConfigError naming the
    entry: ``reward.weights.correct: expected a finite number, got 'high'``."""
    out = {}
    for name, w in value.items():
        number = _yaml_float(w)
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{path}: expected names as keys, got {name!r}")
        if isinstance(number, bool) or not isinstance(number, (int, float)) or not math.isfinite(number):
            raise ConfigError(f"{path}{sep}{name}: expected a finite number, got {w!r}")
        out[name] = float(number) if isinstance(w, str) else number
    return out


def _build(cls: type, raw: Any, path: str) -> Any:
    if not isinstance(raw, dict):
        raise ConfigError(f"{path or 'config'}: expected a mapping of fields, got {raw!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in raw.items():
        where = f"{path}.{key}" if path else str(key)
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = (
                f"; did you mean '{path + '.' if path else ''}{close[0]}'?"
                if close
                else f"; known fields: {', '.join(names)}"
            )
            raise ConfigError(f"unknown field '{where}'{hint}")
        tp = hints[key]
        if dataclasses.is_dataclass(tp):
            kwargs[key] = _build(tp, value, where)
        else:
            kwargs[key] = _coerce(where, tp, _from_cli(value, tp))
    return cls(**kwargs)


def _expand_preset(raw: dict) -> dict:
    """raw with its algorithm mapping = the preset's differences from the defaults, then the user's own fields."""
    algo = raw.get("algorithm") or {}
    if not isinstance(algo, dict):
        raise ConfigError(f"algorithm: expected a mapping of fields, got {algo!r}")
    preset = algo.get("preset", AlgorithmConfig.preset)
    if not isinstance(preset, str) or preset not in PRESETS:
        raise ConfigError(f"algorithm.preset: expected one of {', '.join(map(repr, PRESETS))}, got {preset!r}")
    return {**raw, "algorithm": {"preset": preset, **PRESETS[preset], **algo}}


def set_path(raw: dict, dotted: str, value: Any) -> None:
    """raw[a][b][c] = value for dotted = 'a.b.c' (intermediate mappings created as needed)."""
    parts = dotted.split(".")
    node = raw
    for p in parts[:-1]:
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            raise ConfigError(f"--set {dotted}: '{p}' is not a mapping")
    node[parts[-1]] = value


class CliText(str):
    """The raw text of a --set value: kept verbatim for string fields, parsed as YAML for all others."""


def _from_cli(value: Any, tp: Any = None) -> Any:
    if isinstance(value, dict):
        return {k: _from_cli(v) for k, v in value.items()}
    if isinstance(value, CliText):
        return str(value) if tp is str else _yaml_or_text(str(value))
    return value


def _yaml_or_text(text: str) -> Any:
    """A --set / --task-option value read as YAML (numbers, booleans, lists), or kept as the text it is when it is
    not valid YAML on its own (e.g. `operators=*`, which YAML would read as an alias).

    >>> _yaml_or_text("12"), _yaml_or_text("*"), _yaml_or_text("[1, 2]"), _yaml_or_text("")
    (12, '*', [1, 2], '')
    """
    if not text.strip():
        return ""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def parse_override(text: str) -> tuple[str, Any]:
    """'train.steps=50' -> ('train.steps', CliText('50')); the value becomes 50 for an int field, '50' for a
    string field, and is otherwise read as YAML (numbers, booleans, lists)."""
    if "=" not in text:
        raise ConfigError(f"--set {text!r}: expected KEY=VALUE, e.g. train.steps=50")
    key, value = text.split("=", 1)
    return key.strip(), CliText(value)


def parse_option(text: str) -> tuple[str, Any]:
    """'digits=2' -> ('digits', 2): a KEY=VALUE option outside the typed tree (task options), read as YAML."""
    key, value = parse_override(text)
    return key, _from_cli(value)


def move_speed_fields(raw: dict, warn: bool = True) -> dict:
    """raw with every speed switch still set at its old place (SPEED_FIELDS_MOVED) moved to ``speed:``; both
    places set is an error. raw itself is left as it is.

    >>> move_speed_fields({"train": {"share_prompt": False, "steps": 3}}, warn=False)
    {'train': {'steps': 3}, 'speed': {'share_prompt': False}}
    """
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in raw.items()}
    for name, section in SPEED_FIELDS_MOVED.items():
        old = out.get(section)
        if not isinstance(old, dict) or name not in old:
            continue
        speed = out.setdefault("speed", {})
        if not isinstance(speed, dict):
            raise ConfigError(f"speed: expected a mapping of fields, got {speed!r}")
        if name in speed:
            raise ConfigError(f"{section}.{name} and speed.{name} are both set; {section}.{name} moved to speed.{name}")
        speed[name] = old.pop(name)
        if warn:
            log.warning("%s.%s moved to speed.%s; read as that (set speed.%s instead)", section, name, name, name)
    return out


def from_dict(raw: dict) -> Config:
    cfg = _build(Config, _expand_preset(move_speed_fields(raw)), "")
    validate(cfg)
    return cfg


def load_config(path: str | Path | None, overrides: list[str] = ()) -> Config:
    """Read YAML (None = defaults), apply --set overrides, expand the preset, validate."""
    raw: dict = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file not found: {p}")
        try:
            raw = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"{p}: not valid YAML ({e})") from None
        except UnicodeDecodeError as e:
            raise ConfigError(
                f"{p}: not a UTF-8 text file (byte {e.start}: {e.reason}); expected a YAML config"
            ) from None
        except OSError as e:
            raise ConfigError(f"{p}: cannot read the config file ({e.strerror or e})") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{p}: expected a mapping at the top level")
    for text in overrides:
        set_path(raw, *parse_override(text))
    return from_dict(raw)


def to_dict(cfg: Config) -> dict:
    """Plain, JSON-serialisable dict of the resolved config (enums as their string values)."""
    return _plain(dataclasses.asdict(cfg))


def _plain(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x.value if isinstance(x, enum.Enum) else x


# ----------------------------------------------------------------------------------------------- ranges

_RANGES: list[tuple[str, Any, str]] = [
    ("model.lora.rank", lambda v: v >= 0, "an integer >= 0 (0 = off)"),
    ("model.lora.alpha", lambda v: v > 0, "a number > 0"),
    ("model.lora.dropout", lambda v: 0 <= v < 1, "a number in [0, 1)"),
    (
        "model.lora.target_modules",
        lambda v: (
            v == "all-linear" or (isinstance(v, list) and len(v) > 0 and all(isinstance(m, str) and m for m in v))
        ),
        "'all-linear' or a non-empty list of module names",
    ),
    ("rollout.group_size", lambda v: v >= 2, "an integer >= 2 (a group needs at least two completions to compare)"),
    ("rollout.temperature", lambda v: v > 0, "a number > 0"),
    ("rollout.top_p", lambda v: 0 < v <= 1, "a number in (0, 1]"),
    ("rollout.top_k", lambda v: v >= 0, "an integer >= 0"),
    ("rollout.max_new_tokens", lambda v: v >= 1, "an integer >= 1"),
    ("algorithm.adv_eps", lambda v: v >= 0, "a number >= 0"),
    ("algorithm.eps_low", lambda v: 0 <= v < 1, "a number in [0, 1)"),
    ("algorithm.eps_high", lambda v: v >= 0, "a number >= 0"),
    ("algorithm.dual_clip_c", lambda v: v > 1, "a number > 1"),
    ("algorithm.cispo_eps_low", lambda v: 0 <= v <= 1, "a number in [0, 1] (1 = no lower bound)"),
    ("algorithm.cispo_eps_high", lambda v: v >= 0, "a number >= 0"),
    ("algorithm.sapo_tau_pos", lambda v: v > 0, "a number > 0"),
    ("algorithm.sapo_tau_neg", lambda v: v > 0, "a number > 0"),
    ("algorithm.cov_ratio", lambda v: 0 < v <= 1, "a number in (0, 1]"),
    ("algorithm.kl_cov_coef", lambda v: v >= 0, "a number >= 0"),
    ("algorithm.is_reject_lo", lambda v: v > 0, "a number > 0"),
    ("algorithm.is_reject_hi", lambda v: v > 0, "a number > 0"),
    ("algorithm.offpolicy_mask_delta", lambda v: v >= 0, "a number >= 0 (0 = off)"),
    ("algorithm.l_max", lambda v: v >= 0, "an integer >= 0"),
    ("algorithm.beta", lambda v: v >= 0, "a number >= 0"),
    ("algorithm.is_c_max", lambda v: v > 0, "a number > 0"),
    ("algorithm.is_c_min", lambda v: v >= 0, "a number >= 0"),
    ("algorithm.overlong_buffer", lambda v: v >= 0, "an integer >= 0"),
    ("algorithm.overlong_penalty", lambda v: v >= 0, "a number >= 0"),
    ("algorithm.max_extra_rounds", lambda v: v >= 0, "an integer >= 0"),
    ("algorithm.gamma", lambda v: 0 <= v <= 1, "a number in [0, 1]"),
    ("algorithm.pass_k", lambda v: v >= 1, "an integer >= 1"),
    ("algorithm.ref_reset_every", lambda v: v >= 0, "an integer >= 0"),
    ("algorithm.lam", lambda v: 0 <= v <= 1, "a number in [0, 1]"),
    ("critic.lr", lambda v: v > 0, "a number > 0"),
    ("critic.value_clip", lambda v: v >= 0, "a number >= 0 (0 = off)"),
    ("critic.grad_clip", lambda v: v >= 0, "a number >= 0 (0 = off)"),
    ("reward.time_limit_s", lambda v: v > 0, "a number > 0 (seconds)"),
    ("reward.model.batch_size", lambda v: v >= 1, "an integer >= 1"),
    ("reward.model.max_length", lambda v: v >= 8, "an integer >= 8 (tokens)"),
    ("reward.judge.batch_size", lambda v: v >= 1, "an integer >= 1"),
    ("reward.judge.max_new_tokens", lambda v: v >= 1, "an integer >= 1"),
    ("reward.judge.time_limit_s", lambda v: v > 0, "a number > 0 (seconds)"),
    ("reward.judge.retries", lambda v: 0 <= v <= 20, "an integer in [0, 20]"),
    ("reward.judge.temperature", lambda v: v >= 0, "a number >= 0"),
    ("reward.judge.min_yes_no_mass", lambda v: 0 <= v <= 1, "a number in [0, 1]"),
    ("train.steps", lambda v: v >= 1, "an integer >= 1"),
    ("train.prompts_per_step", lambda v: v >= 1, "an integer >= 1"),
    ("train.mu", lambda v: v >= 1, "an integer >= 1"),
    ("train.minibatches", lambda v: v >= 1, "an integer >= 1"),
    ("train.micro_batch_size", lambda v: v >= 1, "an integer >= 1"),
    ("train.lr", lambda v: v > 0, "a number > 0"),
    ("train.weight_decay", lambda v: v >= 0, "a number >= 0"),
    ("train.warmup_steps", lambda v: v >= 0, "an integer >= 0"),
    ("train.grad_clip", lambda v: v >= 0, "a number >= 0 (0 = off)"),
    ("train.save_every", lambda v: v >= 0, "an integer >= 0"),
    (
        "train.device",
        lambda v: v in ("auto", "cpu", "cuda") or (v.startswith("cuda:") and v[5:].isdigit()),
        "one of 'auto', 'cpu', 'cuda', 'cuda:N'",
    ),
    ("train.save_every_minutes", lambda v: v >= 0, "a number >= 0 (0 = off)"),
    ("train.keep_last", lambda v: v >= 1, "an integer >= 1"),
    ("train.adam_beta1", lambda v: 0 <= v < 1, "a number in [0, 1)"),
    ("train.adam_beta2", lambda v: 0 <= v < 1, "a number in [0, 1)"),
    ("train.min_lr_ratio", lambda v: 0 <= v <= 1, "a number in [0, 1]"),
    ("train.samples_per_step", lambda v: v >= 0, "an integer >= 0"),
    ("train.max_nonfinite_steps", lambda v: v >= 1, "an integer >= 1"),
    ("train.prompt_floor", lambda v: 0 < v <= 1, "a number in (0, 1]"),
    ("eval.every_steps", lambda v: v >= 0, "an integer >= 0"),
    ("eval.batch_size", lambda v: v >= 1, "an integer >= 1"),
    ("eval.max_new_tokens", lambda v: v >= 0, "an integer >= 0 (0 = rollout.max_new_tokens)"),
    ("eval.num_problems", lambda v: v >= 1, "an integer >= 1"),
    (
        "run.report_to",
        lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v) and len(set(v)) == len(v),
        "a list of distinct tracker names (tensorboard, wandb, mlflow)",
    ),
    ("run.table_every_steps", lambda v: v >= 0, "an integer >= 0 (0 = off)"),
    ("run.table_groups", lambda v: v >= 1, "an integer >= 1"),
]


TRACKERS = ("tensorboard", "wandb", "mlflow")  # what run.report_to accepts (grpolab/training/trackers.py)


def get_path(cfg: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg


def validate(cfg: Config) -> None:
    """Range checks that a type alone cannot express (every float field is already finite: _coerce); raises
    ConfigError naming the field."""
    for path, ok, expected in _RANGES:
        value = get_path(cfg, path)
        if not ok(value):
            raise ConfigError(f"{path}: expected {expected}, got {value!r}")
    unknown = [x for x in cfg.run.report_to if x not in TRACKERS]
    if unknown:
        raise ConfigError(f"run.report_to: unknown tracker {unknown[0]!r}; expected any of {', '.join(TRACKERS)}")
    a = cfg.algorithm
    if a.overlong_buffer >= cfg.rollout.max_new_tokens:
        raise ConfigError(
            f"algorithm.overlong_buffer: expected < rollout.max_new_tokens ({cfg.rollout.max_new_tokens}), got {a.overlong_buffer}"
        )
    j = cfg.reward.judge
    if j.min_score >= j.max_score:
        raise ConfigError(
            f"reward.judge.max_score: expected > reward.judge.min_score ({j.min_score:g}), got {j.max_score:g}"
        )
    if a.estimator == "pass_at_k" and a.pass_k >= cfg.rollout.group_size:
        raise ConfigError(
            f"algorithm.pass_k: expected < rollout.group_size ({cfg.rollout.group_size}): a group has pass@k signal "
            f"only with a pass and at least pass_k failures; got {a.pass_k}"
        )
    if a.estimator == "pass_at_k" and a.beta > 0 and a.kl_placement == "reward":
        raise ConfigError(
            "algorithm.kl_placement: expected loss with estimator pass_at_k and beta > 0 (the KL-shaped reward would "
            "be compared with pass_threshold), got reward"
        )
    if a.baseline == "batch_mean" and a.scaling == "group_std":
        raise ConfigError(
            "algorithm.scaling: expected batch_std or none with baseline batch_mean (an all-equal group would be "
            "divided by adv_eps alone), got group_std"
        )
    if a.is_c_min > a.is_c_max:
        raise ConfigError(f"algorithm.is_c_min: expected <= algorithm.is_c_max ({a.is_c_max}), got {a.is_c_min}")
    if a.is_reject_lo > a.is_reject_hi:
        raise ConfigError(
            f"algorithm.is_reject_lo: expected <= algorithm.is_reject_hi ({a.is_reject_hi}), got {a.is_reject_lo}"
        )
    if a.clip_cov_lb >= a.clip_cov_ub:
        raise ConfigError(
            f"algorithm.clip_cov_lb: expected < algorithm.clip_cov_ub ({a.clip_cov_ub}), got {a.clip_cov_lb}"
        )
    rollouts = cfg.train.prompts_per_step * cfg.rollout.group_size
    if rollouts % cfg.train.minibatches:
        raise ConfigError(
            f"train.minibatches: expected a divisor of prompts_per_step * group_size = {rollouts}, got {cfg.train.minibatches}"
        )
