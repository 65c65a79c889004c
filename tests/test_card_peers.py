"""The objective card's peer equivalents (grpolab/card/), checked by the peers' own code.

Optional: the tests of a peer skip when it is not installed (install commands: docs/algorithms.md, "Checking the
card against the peers"). For every preset and a grid of non-default choices (CASES):

* config -- the card's TRL settings go to ``trl.GRPOConfig`` / ``trl.RLOOConfig``; its verl settings become Hydra
  overrides of verl's own ``trainer/config/ppo_trainer.yaml`` (a key the defaults lack fails unless the card adds
  it with '+') and then verl's own config dataclasses; its OpenRLHF flags go to the argument parser and the
  argument checks of ``openrlhf/cli/train_ppo_ray.py``.
* numbers -- on one fixed batch, wherever the peer computes the quantity: advantages (with KL in the reward and
  the overlong penalty), the sampler-mismatch weights, and the whole per-batch loss (surrogate, aggregation, KL,
  entropy). A row the card calls ``exact`` must give grpolab's numbers; a ``nearest`` row whose difference is a
  fixed epsilon / std kind must give them once grpolab uses the peer's value; one whose difference is a clamp
  must give them on this batch, which stays inside the clamp.

OpenRLHF's parser sits under ``if __name__ == "__main__"`` and its loss functions live in modules whose packages
import flash-attn and DeepSpeed; verl's advantage step lives in a module that imports its whole Ray trainer. Those
few definitions are compiled verbatim from the installed peer's source file (``peer_defs``), nothing is copied.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib.util
import itertools
import logging
import sys
import typing
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from grpolab.algo.advantages import StdKind, compute_advantages
from grpolab.algo.aggregation import token_weights
from grpolab.algo.importance import ISParams, RejectParams, correction
from grpolab.algo.kl import token_kl
from grpolab.algo.loss import ObjectiveParams, objective, offpolicy_sequence_mask
from grpolab.algo.surrogate import ClipParams, PolicyLossParams
from grpolab.card import AXES, EXACT, NEAREST, STD_EPS, objective_card, peer_settings
from grpolab.config import from_dict
from grpolab.rewards.overlong import soft_overlong_penalty

BASE = {"rollout": {"group_size": 4, "max_new_tokens": 24}, "train": {"prompts_per_step": 2}}
IS_BOUNDS = {"beta": 0.0, "is_c_min": 0.8, "is_c_max": 1.25}
CASES = {
    **{p: {"preset": p} for p in ["grpo", "dapo", "dr_grpo", "rloo", "gspo"]},
    "population_std": {"std_kind": "population"},
    "trl_eps": {"adv_eps": 1e-4, "beta": 0.0},
    "batch_std": {"scaling": "batch_std"},
    "loo_group_std": {"baseline": "leave_one_out"},
    "dual_clip": {"surrogate": "dual_clip", "dual_clip_c": 2.5, "beta": 0.0},
    "gspo_token_mean": {"preset": "gspo", "aggregation": "token_mean"},
    "token_sum": {"aggregation": "seq_mean_token_sum", "beta": 0.0},
    "token_mean_2_minibatches": {"preset": "dapo", "minibatches": 2},
    "l_max": {"preset": "dr_grpo", "l_max": 16},
    "kl_loss_k1": {"beta": 0.05, "kl_estimator": "k1", "aggregation": "token_mean"},
    "kl_loss_k2": {"beta": 0.05, "kl_estimator": "k2"},
    "kl_reward_k1": {"beta": 0.05, "kl_placement": "reward", "kl_estimator": "k1"},
    "kl_reward_k3": {"beta": 0.05, "kl_placement": "reward", "kl_estimator": "k3"},
    "rloo_kl_reward_k1": {"preset": "rloo", "beta": 0.05, "kl_placement": "reward", "kl_estimator": "k1"},
    **{
        f"is_{m}": {"is_mode": m, **IS_BOUNDS}
        for m in ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]
    },
    "entropy_token_mean": {"entropy_coef": 0.01, "aggregation": "token_mean", "beta": 0.0},
    "entropy": {"entropy_coef": 0.01, "beta": 0.0},
    "mask_truncated": {"mask_truncated": True},
    "overlong": {"overlong_buffer": 8, "overlong_penalty": 0.5},
    "dynamic_sampling": {"preset": "dapo", "max_extra_rounds": 2},
    "mu_minibatches": {"mu": 2, "minibatches": 2},
    # the objective menu (docs/algorithms.md): CISPO, GMPO, SAPO, Clip-Cov, KL-Cov, ScaleRL, IcePop, rejection, OPSM
    **{p: {"preset": p} for p in ["cispo", "gmpo", "sapo", "scalerl"]},
    "cispo_bounds": {"surrogate": "cispo", "cispo_eps_low": 0.2, "cispo_eps_high": 0.28, "beta": 0.0},
    "gmpo_token_mean": {"preset": "gmpo", "aggregation": "token_mean"},
    "clip_cov": {
        "surrogate": "clip_cov",
        "beta": 0.0,
        "cov_ratio": 1.0,
        "clip_cov_lb": 0.05,
        "aggregation": "token_mean",
    },
    # cov_ratio 1: every token selected, as verl does (below 1 the counts differ: the card's verl row is nearest)
    "kl_cov": {"surrogate": "kl_cov", "beta": 0.0, "cov_ratio": 1.0, "kl_cov_coef": 0.5, "aggregation": "token_mean"},
    "icepop": {"preset": "icepop", "beta": 0.0},
    "geometric_reject": {"is_mode": "sequence_truncate", "is_reject": "geometric", **IS_BOUNDS},
    "offpolicy_mask": {"offpolicy_mask_delta": 0.05, "beta": 0.0},
    # the 2026 additions (issue 59): DPPO's TV and binary-KL trust regions, LUSPO, DeepSeek-V3.2's unbiased KL
    # the DPPO presets anchor on the sampler (pi_old: sampler, verl's bypass mode: nearest, not compared); the
    # trust region's math is compared with the anchor recomputed, where verl's row is exact (the anchor only decides
    # which log-probabilities enter as pi_old)
    **{p: {"preset": p, "pi_old": "trainer"} for p in ["dppo_tv", "dppo_kl"]},
    "luspo": {"preset": "luspo"},
    "dppo_tv_bounds": {"surrogate": "dppo_tv", "dppo_low": 0.05, "dppo_high": 0.1, "dppo_ratio_cap": 2.0, "beta": 0.0},
    "kl_bias_correction": {"beta": 0.05, "kl_bias_correction": True},
}
TOL = dict(rtol=1e-6, atol=1e-7)  # peers compute in float32 in places (TRL's rewards, OpenRLHF's KL)
# TRL 1.16 defaults gradient_checkpointing=True, a name transformers 5.2x deprecates
pytestmark = pytest.mark.filterwarnings("ignore:.*gradient_checkpointing.*:FutureWarning")


def case_config(name: str):
    algo = dict(CASES[name])
    train = {**BASE["train"], **{k: algo.pop(k) for k in ("mu", "minibatches") if k in algo}}
    return from_dict({**BASE, "train": train, "algorithm": algo})


def card_of(cfg) -> dict:
    return objective_card(cfg)["equivalents"]


def all_exact(eq: dict, *axes: str) -> bool:
    return all(eq[a]["match"] == EXACT for a in axes)


def with_algorithm(cfg, **fields):
    return dataclasses.replace(cfg, algorithm=dataclasses.replace(cfg.algorithm, **fields))


def advantage_reference(cfg, peer: str):
    """The config whose grpolab advantages the peer must reproduce: cfg itself when the card says exact, cfg with the
    peer's fixed epsilon and sample std when that turns the row exact (the difference was only that), else None."""
    if card_of(cfg)[peer]["advantage"]["match"] == EXACT:
        return cfg
    aligned = with_algorithm(cfg, adv_eps=STD_EPS[peer], std_kind=StdKind.SAMPLE)
    return aligned if card_of(aligned)[peer]["advantage"]["match"] == EXACT else None


def kl_in_reward(cfg) -> bool:
    return cfg.algorithm.beta > 0 and cfg.algorithm.kl_placement == "reward"


BASE_MODULES = set(sys.stdlib_module_names) | {"torch", "numpy"}


def peer_defs(path: Path, names: list[str], namespace: dict, cls: str | None = None) -> dict:
    """Compile the named top-level definitions (or methods of class ``cls``) of a peer's source file, verbatim, into
    ``namespace``; the file's imports of the standard library, torch and numpy come with them."""
    tree = ast.parse(path.read_text())
    body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls).body if cls else tree.body
    picked = [
        n
        for n in body
        if getattr(n, "name", None) in names
        or isinstance(n, ast.Assign)
        and any(getattr(t, "id", None) in names for t in n.targets)
    ]
    assert {getattr(n, "name", None) or n.targets[0].id for n in picked} == set(names), path
    imports = [
        n
        for n in tree.body
        if isinstance(n, (ast.Import, ast.ImportFrom))
        and ((n.module or "") if isinstance(n, ast.ImportFrom) else n.names[0].name).split(".")[0] in BASE_MODULES
    ]
    namespace.update({k: getattr(typing, k) for k in ("Any", "List", "Optional", "Tuple", "Union")})
    exec(compile(ast.Module(body=imports + picked, type_ignores=[]), str(path), "exec"), namespace)
    return namespace


def package_dir(name: str) -> Path:
    try:
        spec = importlib.util.find_spec(name)  # locates the package without importing it
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        pytest.skip(f"{name} is not installed")
    return Path(list(spec.submodule_search_locations)[0])


# --------------------------------------------------------------------------------------------- the fixed batch

P, G, T = 2, 4, 6
REWARDS = torch.tensor([[1.0, 0.0, 0.5, 0.25], [0.7, 0.7, 0.7, 0.7]], dtype=torch.float64)  # group 2: no signal
LENGTHS = torch.tensor([6, 5, 4, 3, 6, 2, 1, 6])
LONG_LENGTHS = torch.tensor([24, 21, 17, 3, 20, 16, 12, 23])  # completion lengths for the overlong penalty


def fixed_batch() -> SimpleNamespace:
    g = torch.Generator().manual_seed(0)
    rand = lambda scale: scale * torch.randn(P * G, T, generator=g, dtype=torch.float64)  # noqa: E731
    logp = -(0.1 + torch.rand(P * G, T, generator=g, dtype=torch.float64))
    old = logp + rand(0.25)
    old[1, 0], old[3, 1] = logp[1, 0] - 1.5, logp[3, 1] - 1.2  # ratios 4.5 and 3.3 where A < 0: the dual clip binds
    return SimpleNamespace(
        logp=logp,
        old=old,
        ref=logp + rand(0.3),
        sampler=old + rand(0.2),
        entropy=0.5 + torch.rand(P * G, T, generator=g, dtype=torch.float64),
        mask=torch.arange(T) < LENGTHS[:, None],
    )


def kl_sum(cfg, b) -> torch.Tensor:
    return (token_kl(b.old, b.ref, cfg.algorithm.kl_estimator) * b.mask).sum(-1)


def grpolab_advantages(cfg, b, lengths=None) -> torch.Tensor:
    """[P*G] advantages; KL in the reward and the overlong penalty applied as the trainer applies them."""
    a = cfg.algorithm
    r = REWARDS.clone().view(-1)
    if a.beta > 0 and a.kl_placement == "reward":
        r = r - a.beta * kl_sum(cfg, b)
    if a.overlong_buffer and lengths is not None:
        r = r + torch.tensor(
            [
                soft_overlong_penalty(int(n), cfg.rollout.max_new_tokens, a.overlong_buffer, a.overlong_penalty)
                for n in lengths
            ],
            dtype=r.dtype,
        )
    return compute_advantages(
        r.view(P, G), baseline=a.baseline, scaling=a.scaling, eps=a.adv_eps, std_kind=a.std_kind
    ).advantages.view(-1)


def grpolab_loss(cfg, b, adv) -> torch.Tensor:
    a = cfg.algorithm
    params = ObjectiveParams(
        surrogate=a.surrogate,
        clip=ClipParams(a.eps_low, a.eps_high, a.dual_clip_c),
        beta=a.beta,
        kl_estimator=a.kl_estimator,
        kl_in_loss=a.kl_placement == "loss",
        entropy_coef=a.entropy_coef,
        policy_loss=PolicyLossParams(**{f.name: getattr(a, f.name) for f in dataclasses.fields(PolicyLossParams)}),
        offpolicy_mask_delta=a.offpolicy_mask_delta,
        kl_bias_correction=a.kl_bias_correction,
    )
    ref = b.ref if a.beta > 0 and a.kl_placement == "loss" else None
    reject = RejectParams(a.is_reject_lo, a.is_reject_hi)
    isw = correction(b.sampler, b.old, b.mask, a.is_mode, ISParams(a.is_c_max, a.is_c_min), a.is_reject, reject).weights
    weights = token_weights(b.mask, a.aggregation, cfg.l_max, group_size=G)
    return objective(b.logp, b.old, ref, adv, weights, isw, b.mask, params, b.entropy, behaviour_logp=b.sampler).total


def test_every_axis_is_on_every_peer_and_settings_merge():
    for name in CASES:
        for peer, eq in card_of(case_config(name)).items():
            assert set(AXES) <= set(eq) and eq["checked_against"].startswith(peer)
            peer_settings(eq)  # no two rows set one key differently
            for axis in AXES:
                match = eq[axis]["match"]
                assert match in (EXACT, NEAREST, "none") and (match == EXACT) != ("difference" in eq[axis])


# --------------------------------------------------------------------------------------------- TRL

TRL_MACHINE = {"use_cpu": True, "bf16": False, "report_to": "none", "save_strategy": "no"}


@pytest.fixture(scope="module")
def trl():
    return pytest.importorskip("trl")


def trl_config(trl, eq, tmp_path, **extra):
    cls = getattr(trl, eq["interface"].split(".")[-1])
    return cls(output_dir=str(tmp_path), **TRL_MACHINE, **peer_settings(eq), **extra)


@pytest.mark.parametrize("name", CASES)
def test_trl_config_takes_the_card_settings(trl, name, tmp_path):
    eq = card_of(case_config(name))["trl"]
    conf = trl_config(trl, eq, tmp_path)
    for key, value in peer_settings(eq).items():
        assert getattr(conf, key) == value, key


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    """A 1-layer, 16-wide Llama with a word-level tokenizer built here (no download, no GGUF)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    words = ["<pad>", "<eos>", *[f"w{i}" for i in range(30)]]
    raw = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="w0"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="<eos>", pad_token="<pad>")
    torch.manual_seed(0)
    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=len(words),
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            eos_token_id=1,
            pad_token_id=0,
        )
    )
    out = tmp_path_factory.mktemp("tiny-peer-llama")
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return str(out), tok


def trl_trainer(trl, eq, tiny_model, tmp_path, fake):
    from datasets import Dataset

    path, tok = tiny_model
    rewards = REWARDS.view(-1).tolist()
    conf = trl_config(trl, eq, tmp_path, model_init_kwargs={"dtype": "float32"}, shuffle_dataset=False)
    cls = getattr(trl, eq["interface"].split(".")[-1].replace("Config", "Trainer"))
    trainer = cls(
        model=path,
        reward_funcs=[lambda prompts, **_: rewards[: len(prompts)]],
        args=conf,
        train_dataset=Dataset.from_list([{"prompt": "w1 w2"}, {"prompt": "w3 w4"}]),
        processing_class=tok,
    )
    trainer._get_per_token_logps_and_entropies = fake  # the per-token numbers of the fixed batch stand in for the model
    return trainer


@pytest.mark.parametrize("name", CASES)
def test_trl_numbers(trl, name, tiny_model, tmp_path, one_thread):
    cfg = case_config(name)
    eq, b = card_of(cfg)["trl"], fixed_batch()
    if cfg.algorithm.is_mode != "none":
        pytest.skip("TRL corrects the sampler mismatch only with use_vllm (vLLM not installed)")
    phase = {"loss": False}

    def fake(model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
        if phase["loss"]:
            return b.logp, b.entropy, None
        n = torch.arange(logits_to_keep, dtype=torch.float64)
        row = torch.arange(input_ids.shape[0], dtype=torch.float64)[:, None]
        policy = -0.4 - 0.05 * n - 0.02 * row
        return (policy if model is trainer.model else policy - 0.1 * torch.cos(n + row)), None, None

    trainer = trl_trainer(trl, eq, tiny_model, tmp_path, fake)
    out = trainer._generate_and_score_completions([{"prompt": "w1 w2"}] * G + [{"prompt": "w3 w4"}] * G)
    reference, checked = advantage_reference(cfg, "trl"), []
    if reference is not None and (not kl_in_reward(cfg) or eq["kl"]["match"] == EXACT):
        width = out["completion_mask"].shape[1]
        gen = SimpleNamespace(
            mask=out["completion_mask"].bool(),
            old=fake(trainer.model, out["completion_ids"], None, width)[0],
            ref=fake(None, out["completion_ids"], None, width)[0],
        )
        torch.testing.assert_close(out["advantages"].double(), grpolab_advantages(reference, gen), **TOL)
        checked.append("advantages")
    if eq["interface"] == "trl.GRPOConfig" and all_exact(
        eq, "surrogate", "aggregation", "kl", "entropy", "offpolicy_mask"
    ):
        phase["loss"] = True
        trainer.model.eval()  # one micro-batch, no gradient accumulation
        adv = grpolab_advantages(cfg, b)
        torch.testing.assert_close(
            trainer._compute_loss(trainer.model, trl_inputs(b, adv)).double(), grpolab_loss(cfg, b, adv), **TOL
        )
        checked.append("loss")
    if not checked:
        pytest.skip("no row here is exact, or nearest by a fixed parameter, where TRL computes the quantity")


def trl_inputs(b, adv: torch.Tensor) -> dict[str, torch.Tensor]:
    """The batch as TRL's _compute_loss takes it (its log-probabilities come from the patched forward)."""
    return {
        "prompt_ids": torch.ones(P * G, 1, dtype=torch.long),
        "prompt_mask": torch.ones(P * G, 1, dtype=torch.long),
        "completion_ids": torch.ones(P * G, T, dtype=torch.long),
        "completion_mask": b.mask.long(),
        "advantages": adv,
        "old_per_token_logps": b.old,
        "ref_per_token_logps": b.ref,
        "num_items_in_batch": b.mask.sum(),
    }


@pytest.mark.parametrize("name", ["kl_bias_correction", "luspo"])
def test_trl_gradients_of_the_2026_options(trl, name, tiny_model, tmp_path, one_thread):
    """DeepSeek-V3.2's unbiased KL (use_bias_correction_kl) and LUSPO (loss_type luspo): the gradient of TRL's own
    loss with respect to the log-probabilities equals grpolab's, in float64."""
    cfg = case_config(name)
    eq, b = card_of(cfg)["trl"], fixed_batch()
    assert all_exact(eq, "surrogate", "aggregation", "kl", "entropy", "offpolicy_mask")
    b.logp.requires_grad_(True)
    trainer = trl_trainer(trl, eq, tiny_model, tmp_path, lambda *args, **kwargs: (b.logp, b.entropy, None))
    trainer.model.eval()  # one micro-batch, no gradient accumulation
    adv = grpolab_advantages(cfg, b)
    (theirs,) = torch.autograd.grad(trainer._compute_loss(trainer.model, trl_inputs(b, adv)), b.logp)
    (ours,) = torch.autograd.grad(grpolab_loss(cfg, b, adv), b.logp)
    torch.testing.assert_close(ours, theirs.double(), rtol=1e-10, atol=1e-12)


def test_trl_soft_overlong_punishment(trl):
    cfg = case_config("overlong")
    a, max_len = cfg.algorithm, cfg.rollout.max_new_tokens
    assert "get_soft_overlong_punishment" in card_of(cfg)["trl"]["overlong"]["reward_function"]
    from trl.rewards import get_soft_overlong_punishment

    punish = get_soft_overlong_punishment(max_completion_len=max_len, soft_punish_cache=a.overlong_buffer)
    lengths = list(range(1, max_len + 1))
    got = [a.overlong_penalty * r for r in punish([[7] * n for n in lengths])]
    assert got == pytest.approx(
        [soft_overlong_penalty(n, max_len, a.overlong_buffer, a.overlong_penalty) for n in lengths]
    )


def test_trl_off_policy_mask(trl):
    """TRL's own DeepSeek-V3.2 mask (GRPOTrainer.get_off_policy_mask, fed the sampler's logprobs as with vLLM) drops
    the sequences grpolab's offpolicy_sequence_mask drops, on the fixed batch and deltas around its drifts."""
    b = fixed_batch()
    drift = ((b.sampler - b.logp) * b.mask).sum(-1) / b.mask.sum(-1)
    dropped = set()
    for adv in (grpolab_advantages(case_config("grpo"), b), -grpolab_advantages(case_config("grpo"), b)):
        for delta in [0.05, 0.1, 0.17, 0.5]:
            eq = card_of(with_algorithm(case_config("offpolicy_mask"), offpolicy_mask_delta=delta))["trl"]
            threshold = eq["offpolicy_mask"]["settings"]["off_policy_mask_threshold"]
            keep = trl.GRPOTrainer.get_off_policy_mask(adv[:, None], b.logp, b.sampler, b.mask.double(), threshold)
            ours = offpolicy_sequence_mask(b.logp, b.sampler, adv, b.mask, delta)
            assert keep.squeeze(-1).bool().tolist() == (~ours).tolist(), delta
            dropped.add(int(ours.sum()))
    assert dropped == {0, 1} and drift.abs().max() > 0.1  # some deltas drop a sequence, others none


# --------------------------------------------------------------------------------------------- verl

VERL_MACHINE = ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1"]


def verl_override(key: str, value) -> str:
    text = "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
    return f"{key}={text}"


def verl_compose(settings: dict):
    """verl's own default config with the card's settings as Hydra overrides (an unknown key raises)."""
    pytest.importorskip("hydra")
    return _verl_compose(
        str(package_dir("verl") / "trainer" / "config"), tuple(verl_override(k, v) for k, v in settings.items())
    )


@functools.lru_cache(maxsize=None)
def _verl_compose(config_dir: str, overrides: tuple[str, ...]):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose(config_name="ppo_trainer", overrides=VERL_MACHINE + list(overrides))


@pytest.mark.parametrize("name", CASES)
def test_verl_config_takes_the_card_settings(name):
    settings = peer_settings(card_of(case_config(name))["verl"])
    conf = verl_compose(settings)
    from omegaconf import OmegaConf

    for key, value in settings.items():
        got = OmegaConf.select(conf, key.lstrip("+"))
        assert (str(got) == str(value)) if isinstance(value, str) else got == value, key
    pytest.importorskip("verl.trainer.ppo.core_algos")
    from verl.utils.config import omega_conf_to_dataclass

    omega_conf_to_dataclass(conf.actor_rollout_ref.actor)  # verl's own checks of the actor and algorithm settings
    omega_conf_to_dataclass(conf.algorithm)


@pytest.fixture(scope="module")
def verl_advantage_step():
    """verl's reward -> KL penalty -> rollout correction -> advantage step (trainer/ppo/ray_trainer.py)."""
    core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")
    from verl import DataProto
    from verl.trainer.config import AlgoConfig
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch
    from verl.utils.torch_functional import masked_mean

    ns = {
        "core_algos": core_algos,
        "AdvantageEstimator": core_algos.AdvantageEstimator,
        "DataProto": DataProto,
        "AlgoConfig": AlgoConfig,
        "masked_mean": masked_mean,
        "np": np,
    }
    peer_defs(
        package_dir("verl") / "trainer" / "ppo" / "ray_trainer.py",
        ["apply_kl_penalty", "compute_response_mask", "compute_advantage"],
        ns,
    )
    return ns, compute_rollout_correction_and_add_to_batch


def verl_advantages(ns, correction, algo, b):
    """verl's advantages [P*G, T] and rollout-correction weights (or None) for the fixed batch."""
    from verl.trainer.ppo.core_algos import get_kl_controller

    scores = torch.zeros(P * G, T, dtype=torch.float64)
    scores[torch.arange(P * G), LENGTHS - 1] = REWARDS.view(-1)  # verl puts the sequence reward on its last token
    data = ns["DataProto"].from_dict(
        tensors={
            "token_level_scores": scores,
            "response_mask": b.mask.long(),
            "old_log_probs": b.old,
            "ref_log_prob": b.ref,
            "rollout_log_probs": b.sampler,
        },
        non_tensors={"uid": np.repeat(np.arange(P), G).astype(object)},
    )
    if algo.use_kl_in_reward:
        data, _ = ns["apply_kl_penalty"](data, get_kl_controller(algo.kl_ctrl), algo.kl_penalty)
    else:
        data.batch["token_level_rewards"] = data.batch["token_level_scores"]
    data, _ = correction(data, algo.rollout_correction)
    data = ns["compute_advantage"](
        data, algo.adv_estimator, num_repeat=G, norm_adv_by_std_in_grpo=algo.norm_adv_by_std_in_grpo, config=algo
    )
    return data.batch["advantages"], data.batch[
        "rollout_is_weights"
    ] if "rollout_is_weights" in data.batch.keys() else None


def verl_loss(actor, b, adv, is_weights, entropy: bool) -> torch.Tensor:
    """verl's ppo_loss on the fixed batch (its model output is one flat row per sequence: prompt token + response)."""
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.losses import ppo_loss

    flat = lambda x: torch.cat([torch.cat([x[i, :n], x.new_zeros(1)]) for i, n in enumerate(LENGTHS)])  # noqa: E731
    tensors = {
        "prompts": torch.ones(P * G, 1, dtype=torch.long),
        "responses": torch.ones(P * G, T, dtype=torch.long),
        "attention_mask": torch.cat([torch.ones(P * G, 1, dtype=torch.long), b.mask.long()], 1),
        "response_mask": b.mask.long(),
        "old_log_probs": b.old,
        "advantages": adv[:, None].expand(-1, T).clone(),
        "ref_log_prob": b.ref,
    }
    if is_weights is not None:
        tensors["rollout_is_weights"] = is_weights
    td = TensorDict(tensors, batch_size=[P * G])
    tu.assign_non_tensor(td, dp_size=1, batch_num_tokens=int(b.mask.sum()), global_batch_size=P * G)
    return ppo_loss(actor, {"log_probs": flat(b.logp), "entropy": flat(b.entropy) if entropy else None}, td)[0]


@pytest.mark.parametrize("name", CASES)
def test_verl_numbers(name, verl_advantage_step, one_thread):
    from verl.utils.config import omega_conf_to_dataclass

    cfg = case_config(name)
    eq, b, checked = card_of(cfg)["verl"], fixed_batch(), []
    conf = verl_compose(peer_settings(eq))
    algo, actor = omega_conf_to_dataclass(conf.algorithm), omega_conf_to_dataclass(conf.actor_rollout_ref.actor)
    advantages, is_weights = verl_advantages(*verl_advantage_step, algo, b)
    kl_ok = (
        eq["kl"]["match"] == EXACT or eq["kl"].get("difference") == "k3 clamped to [-10, 10]"
    )  # this batch stays inside
    reference = advantage_reference(cfg, "verl")
    if cfg.algorithm.is_reject != "none":  # the card's difference: verl's rejection zeroes A before its advantage step
        reference = None
    if reference is not None and kl_ok:
        torch.testing.assert_close(advantages[:, 0], grpolab_advantages(reference, b), **TOL)
        checked.append("advantages")
    if all_exact(eq, "surrogate", "aggregation", "entropy", "importance_sampling", "offpolicy_mask") and kl_ok:
        adv = grpolab_advantages(cfg, b)
        got = verl_loss(actor, b, adv, is_weights, bool(cfg.algorithm.entropy_coef))
        torch.testing.assert_close(got, grpolab_loss(cfg, b, adv), **TOL)
        checked.append("loss")
    if not checked:
        pytest.skip("no row here is exact, or nearest by a fixed parameter, where verl computes the quantity")


@pytest.mark.parametrize("name", ["dppo_tv", "dppo_kl", "dppo_tv_bounds", "luspo"])
def test_verl_gradients_of_the_2026_surrogates(name, one_thread):
    """DPPO (both trust regions, a binding ratio cap) and LUSPO: the gradient of the whole loss with respect to the
    log-probabilities equals that of verl's own ppo_loss, in float64 (the masks and the cap decide which tokens move)."""
    pytest.importorskip("verl.trainer.ppo.core_algos")
    from verl.utils.config import omega_conf_to_dataclass

    cfg = case_config(name)
    eq, b = card_of(cfg)["verl"], fixed_batch()
    assert all_exact(eq, "surrogate", "aggregation", "kl", "entropy", "importance_sampling")
    actor = omega_conf_to_dataclass(verl_compose(peer_settings(eq)).actor_rollout_ref.actor)
    adv = grpolab_advantages(cfg, b)
    b.logp.requires_grad_(True)
    (theirs,) = torch.autograd.grad(verl_loss(actor, b, adv, None, False), b.logp)
    (ours,) = torch.autograd.grad(grpolab_loss(cfg, b, adv), b.logp)
    assert (ours == 0).any() and (ours != 0).any(), "the batch has both masked (or clipped) and moving tokens"
    torch.testing.assert_close(ours, theirs, rtol=1e-10, atol=1e-12)


def test_verl_geometric_rejection():
    """verl's rollout rejection (the card's rollout_rs / rollout_rs_threshold) keeps exactly the sequences grpolab's
    geometric rejection keeps, for bounds that reject some of the fixed batch's sequences and keep others."""
    pytest.importorskip("verl.trainer.ppo.core_algos")
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_rejection_mask

    b = fixed_batch()
    counts = []
    for lo, hi in [(0.9, 1.1), (0.95, 1.02), (0.999, 1.001)]:
        cfg = with_algorithm(case_config("geometric_reject"), is_reject_lo=lo, is_reject_hi=hi)
        settings = peer_settings(card_of(cfg)["verl"])
        kept, _ = compute_rollout_rejection_mask(
            b.old - b.sampler,
            b.mask.double(),
            settings["algorithm.rollout_correction.rollout_rs"],
            settings["algorithm.rollout_correction.rollout_rs_threshold"],
        )
        a = cfg.algorithm
        ours = correction(b.sampler, b.old, b.mask, "none", ISParams(2.0, 0.5), a.is_reject, RejectParams(lo, hi))
        assert (kept.sum(-1) == 0).tolist() == ours.rejected.tolist(), (lo, hi)
        assert ((kept > 0) == (b.mask & ~ours.rejected[:, None])).all()
        counts.append(int(ours.rejected.sum()))
    assert counts == [2, 7, 8]  # a few, most, all of the fixed batch's sequences


def test_verl_dapo_reward_manager_overlong_penalty():
    pytest.importorskip("verl.trainer.ppo.core_algos")
    from omegaconf import DictConfig
    from verl import DataProto
    from verl.utils.ray_utils import get_event_loop

    # the reward_loop package imports aiohttp and its servers; its two classes come straight from their files
    manager_dir = package_dir("verl") / "experimental" / "reward_loop" / "reward_manager"
    ns = peer_defs(
        manager_dir / "base.py",
        ["RawRewardFn", "RewardManagerBase"],
        {"DataProto": DataProto, "get_event_loop": get_event_loop, "DictConfig": DictConfig, "AutoTokenizer": object},
    )
    ns["register"] = lambda name: lambda cls: cls  # the registry decorator, not needed here
    peer_defs(manager_dir / "dapo.py", ["DAPORewardManager"], ns)
    cfg = case_config("overlong")
    a, max_len = cfg.algorithm, cfg.rollout.max_new_tokens
    tokenizer = SimpleNamespace(decode=lambda *a, **k: "")
    manager = ns["DAPORewardManager"](
        verl_compose(peer_settings(card_of(cfg)["verl"])), tokenizer, compute_score=lambda **kw: 0.0
    )
    for n in range(1, max_len + 1):
        data = DataProto.from_dict(
            tensors={
                "responses": torch.ones(1, max_len, dtype=torch.long),
                "attention_mask": torch.cat([torch.ones(1, 2), (torch.arange(max_len) < n).float()[None]], 1).long(),
            },
            non_tensors={
                "data_source": np.array(["x"], dtype=object),
                "extra_info": np.array([{}], dtype=object),
                "reward_model": np.array([{"ground_truth": "1"}], dtype=object),
            },
        )
        got = manager.loop.run_until_complete(manager.run_single(data))["reward_score"]
        assert float(got) == pytest.approx(soft_overlong_penalty(n, max_len, a.overlong_buffer, a.overlong_penalty)), n


# --------------------------------------------------------------------------------------------- OpenRLHF


@pytest.fixture(scope="module")
def openrlhf():
    """train_ppo_ray.py's parser, its argument checks, and the loss / advantage code it runs."""
    root = package_dir("openrlhf")
    tree = ast.parse((root / "cli" / "train_ppo_ray.py").read_text())
    main = next(n for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test)).body
    parse_at = next(i for i, n in enumerate(main) if ast.unparse(n) == "args = parser.parse_args()")
    train_at = next(i for i, n in enumerate(main) if ast.unparse(n) == "train(args)")
    ns = peer_defs(root / "cli" / "train_ppo_ray.py", [], peer_defs(root / "utils" / "config.py", ["hierarchize"], {}))
    exec(compile(ast.Module(body=main[:parse_at], type_ignores=[]), "train_ppo_ray.py", "exec"), ns)
    checks = ast.Module(
        body=[n for n in main[parse_at + 1 : train_at] if not isinstance(n, (ast.Import, ast.ImportFrom))],
        type_ignores=[],
    )
    peer_defs(root / "models" / "utils.py", ["masked_mean", "compute_approx_kl", "compute_reward"], ns)
    peer_defs(root / "models" / "loss.py", ["aggregate_loss", "PolicyLoss"], ns)
    ns["logger"] = logging.getLogger("openrlhf")
    peer_defs(
        root / "trainer" / "ppo_utils" / "length_penalty.py",
        ["apply_overlong_penalty", "apply_stop_properly_penalty", "apply_length_penalties"],
        ns,
    )
    ns.update(Experience=object, itertools=itertools)
    peer_defs(
        root / "trainer" / "ppo_utils" / "experience_maker.py",
        ["compute_advantages_and_returns", "get_advantages_and_returns", "get_cumulative_returns"],
        ns,
        cls="RemoteExperienceMaker",
    )
    return ns, compile(checks, "train_ppo_ray.py", "exec")


def openrlhf_argv(settings: dict) -> list[str]:
    argv = ["--reward.remote_url", "http://reward.invalid"]  # its checks want a reward source for dynamic filtering
    for flag, value in settings.items():
        if value is True:
            argv.append(flag)
        elif value is not False and value is not None:
            argv += [flag, *map(str, value if isinstance(value, list) else [value])]
    return argv


def openrlhf_args(openrlhf, settings: dict):
    ns, checks = openrlhf
    scope = {**ns, "args": ns["hierarchize"](ns["parser"].parse_args(openrlhf_argv(settings)))}
    exec(checks, scope)  # the script's own argument checks (asserts) between parse_args() and train(args)
    return scope["args"]


@pytest.mark.parametrize("name", CASES)
def test_openrlhf_parser_takes_the_card_flags(openrlhf, name):
    settings = peer_settings(card_of(case_config(name))["openrlhf"])
    args = openrlhf_args(openrlhf, settings)
    for flag, value in settings.items():
        got = args
        for part in flag.lstrip("-").split("."):
            got = getattr(got, part)
        assert (list(got) if isinstance(value, list) else got) == value, flag


def openrlhf_advantages(ns, args, b) -> tuple[torch.Tensor, torch.Tensor]:
    """OpenRLHF's per-token advantages [P*G, T] for the fixed batch (experience_maker's advantage step), and the
    per-token KL it puts in the reward."""
    kl_coef = args.algo.kl.init_coef
    kl = (
        ns["compute_approx_kl"](b.old, b.ref, kl_estimator=args.algo.kl.estimator)
        if kl_coef > 0 and not args.algo.kl.use_loss
        else torch.zeros_like(b.old)
    )  # as experience_maker.make_experience does
    exp = SimpleNamespace(
        rewards=REWARDS.view(-1).clone(),
        index=list(range(P * G)),
        kl=kl,
        action_mask=b.mask,
        info={},
        response_length=LONG_LENGTHS,
        truncated=None,
    )
    maker = SimpleNamespace(
        strategy=SimpleNamespace(args=args),
        advantage_estimator=args.algo.advantage.estimator,
        kl_ctl=SimpleNamespace(value=kl_coef),
    )
    for method in ("get_advantages_and_returns", "get_cumulative_returns"):
        setattr(maker, method, ns[method].__get__(maker))
    return ns["compute_advantages_and_returns"](maker, [exp])[0].advantages.double(), kl


def openrlhf_loss(ns, args, b, adv) -> torch.Tensor:
    """The actor loss of ppo_actor.py's training step: PolicyLoss + KL loss * coef - entropy loss * coef."""
    is_ = args.algo.advantage
    policy_loss = ns["PolicyLoss"](
        *args.actor.eps_clip_low_high,
        dual_clip=args.actor.dual_clip,
        token_level_loss=args.actor.loss_agg_mode == "token-mean",
        policy_loss_type=args.actor.policy_loss_type,
        is_correction_level=is_.is_correction_level,
        is_correction_mode=is_.is_correction_mode,
        is_correction_gating=is_.is_correction_gating,
        is_correction_threshold=is_.is_correction_threshold,
    )
    per_token_adv = adv[:, None].expand(-1, T)
    loss = policy_loss(b.logp, b.old, per_token_adv, action_mask=b.mask, rollout_log_probs=b.sampler)[0]
    if args.algo.kl.use_loss:
        kl = ns["compute_approx_kl"](b.logp, b.ref, b.old, args.algo.kl.estimator)
        loss = loss + ns["aggregate_loss"](kl, b.mask) * args.algo.kl.init_coef
    if args.actor.entropy_coef:
        loss = loss - ns["aggregate_loss"](b.entropy, b.mask) * args.actor.entropy_coef
    return loss.double()


@pytest.mark.parametrize("name", CASES)
def test_openrlhf_numbers(openrlhf, name, one_thread):
    ns, _ = openrlhf
    cfg = case_config(name)
    eq, b, checked = card_of(cfg)["openrlhf"], fixed_batch(), []
    args = openrlhf_args(openrlhf, peer_settings(eq))
    got, kl = openrlhf_advantages(ns, args, b)
    reference = advantage_reference(cfg, "openrlhf")
    if reference is not None and kl_in_reward(cfg):  # the card's difference: KL as a per-token reward-to-go, added
        base = grpolab_advantages(with_algorithm(reference, beta=0.0), b, LONG_LENGTHS)  # after group normalisation
        to_go = (kl * b.mask).flip(-1).cumsum(-1).flip(-1)
        torch.testing.assert_close(got[b.mask], (base[:, None] - args.algo.kl.init_coef * to_go)[b.mask], **TOL)
        checked.append("advantages (KL as reward-to-go)")
    elif reference is not None:
        want = grpolab_advantages(reference, b, LONG_LENGTHS)[:, None].expand(-1, T)
        torch.testing.assert_close(got[b.mask], want[b.mask], **TOL)
        checked.append("advantages")
    kl_ok = (
        eq["kl"]["match"] == EXACT or eq["kl"].get("difference") == "estimate clamped to [-10, 10]"
    )  # this batch stays inside
    if all_exact(eq, "surrogate", "aggregation", "entropy", "importance_sampling", "offpolicy_mask") and kl_ok:
        adv = grpolab_advantages(cfg, b)
        torch.testing.assert_close(openrlhf_loss(ns, args, b, adv), grpolab_loss(cfg, b, adv), **TOL)
        checked.append("loss")
    if not checked:
        pytest.skip("no row here is exact, or nearest by a fixed parameter, where OpenRLHF computes the quantity")
