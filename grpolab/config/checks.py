"""Range checks a type alone cannot express, each naming the field and what was expected."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path
from typing import Any

from ..algo.surrogate import PolicyLossParams
from ..errors import ConfigError
from .schema import Config

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
    ("rollout.max_staleness", lambda v: v >= 0, "an integer >= 0 (0 = synchronous)"),
    ("rollout.worker_threads", lambda v: v >= 0, "an integer >= 0 (0 = torch's default)"),
    ("rollout.num_servers", lambda v: v >= 1, "an integer >= 1"),
    (
        "rollout.servers",
        lambda v: isinstance(v, list) and all(isinstance(u, str) and u.startswith(("http://", "https://")) for u in v),
        "a list of server URLs (http://host:port)",
    ),
    ("algorithm.adv_eps", lambda v: v >= 0, "a number >= 0"),
    ("algorithm.eps_low", lambda v: 0 <= v < 1, "a number in [0, 1)"),
    ("algorithm.eps_high", lambda v: v >= 0, "a number >= 0"),
    ("algorithm.dual_clip_c", lambda v: v > 1, "a number > 1"),
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
    (
        "algorithm.ref_reset_optimizer",
        lambda v: v is None or isinstance(v, bool),
        "true, false or null (null: true when ref_reset_every > 0, as ProRL)",
    ),
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
    ("train.loss_scale_init", lambda v: v >= 1, "a number >= 1"),
    ("train.loss_scale_growth_interval", lambda v: v >= 1, "an integer >= 1"),
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


def loss_parameter_ranges() -> list[tuple[str, Any, str]]:
    """The surrogates' parameters (algorithm.*), with the ranges their algo dataclass declares (PolicyLossParams)."""
    return [(f"algorithm.{f.name}", *f.metadata["valid"]) for f in fields(PolicyLossParams) if "valid" in f.metadata]


def validate(cfg: Config) -> None:
    """Range checks that a type alone cannot express (every float field is already finite: _coerce); raises
    ConfigError naming the field."""
    for path, ok, expected in _RANGES + loss_parameter_ranges():
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
    if a.estimator in ("maxrl", "gdpo") and a.beta > 0 and a.kl_placement == "reward":
        raise ConfigError(
            f"algorithm.kl_placement: expected loss with estimator {a.estimator} and beta > 0 (maxrl divides by the "
            "group's mean reward, a success rate; gdpo normalises the reward components, which the KL-shaped total "
            "does not reach), got reward"
        )
    if a.kl_bias_correction and a.kl_placement == "reward":
        raise ConfigError(
            "algorithm.kl_placement: expected loss with kl_bias_correction (the ratio pi_theta / pi_old weights the "
            "KL term of the loss; a KL in the reward is computed before any update, where the ratio is 1), got reward"
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
    validate_staleness(cfg)
    validate_server_devices(cfg)
    validate_fp16(cfg)
    validate_sampler_anchor(cfg)
    rollouts = cfg.train.prompts_per_step * cfg.rollout.group_size
    if rollouts % cfg.train.minibatches:
        raise ConfigError(
            f"train.minibatches: expected a divisor of prompts_per_step * group_size = {rollouts}, got {cfg.train.minibatches}"
        )


def validate_sampler_anchor(cfg: Config) -> None:
    """algorithm.pi_old = sampler: pi_old is q, so every correction that compares pi_old with q would be the
    constant 1 (refused: a knob that does nothing). q is the sampler's untruncated softmax at the temperature (as the
    trainer's pi_theta), whatever top-k / top-p drew the token."""
    a = cfg.algorithm
    if a.pi_old != "sampler":
        return
    inert = [("algorithm.is_mode", a.is_mode, "none"), ("algorithm.is_reject", a.is_reject, "none")]
    for path, value, want in inert:
        if value != want:
            raise ConfigError(
                f"{path}: expected {want} with algorithm.pi_old sampler (pi_old is then the sampler's q, so the weight "
                f"pi_old / q is 1 on every token), got {value}"
            )


FP16_NEEDS = (
    ("model.dtype", "float32", "fp32 master weights: loss scaling unscales the gradient into them"),
    ("train.strategy", "ddp", "the overflow check and the unscale are written for whole (unsharded) gradients"),
    ("algorithm.estimator", "!gae", "PPO's critic updates without a loss scale"),
)
"""What train.precision fp16 needs of other fields: (field, value or !excluded value, why)."""


def validate_fp16(cfg: Config) -> None:
    """train.precision fp16 (grpolab/training/loss_scale.py) with a field of FP16_NEEDS set otherwise: ConfigError."""
    if cfg.train.precision != "fp16":
        return
    for path, want, why in FP16_NEEDS:
        value = get_path(cfg, path)
        if (value == want[1:]) if want.startswith("!") else (value != want):
            expected = f"anything but {want[1:]}" if want.startswith("!") else want
            raise ConfigError(f"{path}: expected {expected} with train.precision fp16 ({why}), got {value}")


DEVICE_FORM = re.compile(r"^(cpu|cuda):(\d+(-\d+)?(,\d+(-\d+)?)*)$")
"""One server's devices (rollout.server_devices): cpu:<core list> or cuda:<GPU ids>, lists as in 0-3,8 or 0,1."""


def validate_server_devices(cfg: Config) -> None:
    """rollout.server_devices: one well-formed entry per server started here (none with servers listed);
    rollout.adapter_dir: a directory (the adapters of rollout.lora_sync: adapter go there)."""
    r = cfg.rollout
    if r.adapter_dir and not Path(r.adapter_dir).is_dir():
        raise ConfigError(f"rollout.adapter_dir: expected an existing directory that the servers read too, got "
                          f"{r.adapter_dir!r}")  # fmt: skip
    if not r.server_devices:
        return
    if r.servers:
        raise ConfigError(
            "rollout.server_devices: expected [] with rollout.servers listed (it places servers grpolab starts; "
            "place yours when you start them), got " + str(r.server_devices)
        )
    bad = [d for d in r.server_devices if not isinstance(d, str) or not DEVICE_FORM.match(d)]
    if bad:
        raise ConfigError(
            f"rollout.server_devices: expected entries cpu:<cores> (e.g. cpu:0-3) or cuda:<GPU ids> (e.g. cuda:0), "
            f"got {bad[0]!r}"
        )
    if len(r.server_devices) != r.num_servers:
        raise ConfigError(
            f"rollout.server_devices: expected one entry per server (rollout.num_servers = {r.num_servers}), got "
            f"{len(r.server_devices)}"
        )


def validate_staleness(cfg: Config) -> None:
    """rollout.max_staleness > 0 (grpolab.training.pipeline): what the asynchronous pipeline needs."""
    r, a = cfg.rollout, cfg.algorithm
    if r.max_staleness == 0:
        return
    if r.engine == "grpolab":
        raise ConfigError(
            "rollout.engine: expected grpolab_process, vllm or vllm_server with rollout.max_staleness > 0 (the next "
            "steps' rollouts are generated in a process of their own while this one updates), got grpolab"
        )
    if r.engine == "vllm_server" and (r.top_k > 0 or r.top_p < 1.0):
        field, value = ("rollout.top_k", r.top_k) if r.top_k > 0 else ("rollout.top_p", r.top_p)
        raise ConfigError(
            f"{field}: expected {'0' if r.top_k > 0 else '1.0'} with rollout.engine vllm_server and "
            f"rollout.max_staleness > 0, got {value}: under top-k / top-p the trainer's untruncated log-probabilities "
            "come from a second scoring request, which a weight sync landing in flight would answer with other "
            "weights than those that sampled"
        )
    if a.dynamic_sampling and a.max_extra_rounds > 0:
        raise ConfigError(
            "algorithm.max_extra_rounds: expected 0 with dynamic sampling and rollout.max_staleness > 0 (a step's "
            "refill rounds are decided on its scores, while the later steps' rounds are already being generated; "
            f"0 keeps the groups with signal without refilling, as ScaleRL does), got {a.max_extra_rounds}"
        )
    if a.is_mode == "none" and a.pi_old == "trainer":
        raise ConfigError(
            "algorithm.is_mode: expected an importance weight (or algorithm.pi_old: sampler) with rollout.max_staleness "
            "> 0, got none: samples come "
            "from a policy up to max_staleness updates old and pi_old is recomputed with the current weights, so only "
            "the weight pi_old / q relates the update to the policy that sampled (the off-policy sequence mask and "
            "the geometric rejection only drop sequences); token_truncate (TIS), token_mask (IcePop) or "
            "sequence_mask (TRL's default)"
        )
    if r.max_staleness >= cfg.train.steps:
        raise ConfigError(
            f"rollout.max_staleness: expected < train.steps ({cfg.train.steps}) with asynchronous training, got "
            f"{r.max_staleness}: every batch would be sampled with the initial weights"
        )
