"""The objective card's exact cells checked by gradient: for every surrogate x importance-sampling mode x off-policy mask x
aggregation cell that the card (grpolab/card/) calls ``exact`` for a peer, grpolab's loss and its gradient with respect
to the log-probabilities equal those of the peer's own code, in float64, on random batches with ragged lengths.

The cells come from the card itself: every combination of the menus (Surrogate, ISMode, Aggregation, the off-policy
mask off / on, and per surrogate the parameter sets whose verdicts differ, PARAMETERS) is put to the card, and each
peer whose surrogate, aggregation, importance-sampling and off-policy-mask rows are all ``exact`` gets a test (KL and
entropy off). The peer's loss is built from the card's settings alone (TRL: GRPOConfig and GRPOTrainer._compute_loss,
with its vLLM importance-sampling block compiled verbatim from the installed source; verl: its Hydra config, rollout
correction and ppo_loss; OpenRLHF: its parser and PolicyLoss), so a new exact claim is tested without a new line here.
Cells whose gradients differ while the values agree are ``nearest`` on the card with the reason (GRADIENT_NEAREST).

Runs under `make test-peers`; each peer's cells skip where that peer is not installed.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import functools
import itertools
import math
import zlib
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from test_card_peers import (  # noqa: F401  (openrlhf, tiny_model: fixtures)
    TRL_MACHINE,
    grpolab_loss,
    openrlhf,
    openrlhf_args,
    tiny_model,
    verl_compose,
    with_algorithm,
)

from grpolab.algo.aggregation import Aggregation
from grpolab.algo.importance import ISMode
from grpolab.algo.surrogate import Surrogate
from grpolab.card import EXACT, NEAREST, PEER_VERSIONS, equivalents, peer_settings
from grpolab.config import from_dict, validate
from grpolab.errors import ConfigError

P, G, T = 2, 4, 7
CELL_AXES = ("surrogate", "aggregation", "importance_sampling", "offpolicy_mask")
# per surrogate, the parameter sets on which the card's verdicts turn (any other surrogate: its defaults only)
PARAMETERS = {
    "dual_clip": [{}, {"dual_clip_c": 1.1}],
    "gspo": [{}, {"eps_low": 3e-4, "eps_high": 4e-4}],
    "cispo": [{}, {"cispo_eps_low": 0.2, "cispo_eps_high": 0.28}],
    "clip_cov": [
        {},
        {"cov_ratio": 1.0, "clip_cov_lb": 0.05},
        {"cov_ratio": 1.0, "clip_cov_lb": 0.05, "clip_cov_select": "largest"},
    ],
    "kl_cov": [{}, {"cov_ratio": 1.0, "kl_cov_coef": 0.5}],
    "dppo_tv": [{}, {"dppo_low": 0.05, "dppo_high": 0.1, "dppo_ratio_cap": 2.0}],
    "dppo_kl": [{}, {"dppo_low": 0.02, "dppo_high": 0.03, "dppo_ratio_cap": 2.0}],
}
FIXED = {"beta": 0.0, "entropy_coef": 0.0, "is_c_min": 0.8, "is_c_max": 1.25}
OFFPOLICY_DELTAS = (0.0, 0.05)
BASE = {"rollout": {"group_size": G, "max_new_tokens": 24}, "train": {"prompts_per_step": P}}
# (peer, surrogate, IS modes): the gradient differs from grpolab's while the value agrees; the card's reason says so.
# TRL's GSPO multiplies the sequence ratio's term by the token IS weights, grpolab the token form's own term
TRL_GSPO_TOKEN_IS = "each token's gradient weighted by its sequence's mean IS weight"
GRADIENT_NEAREST = {("trl", "gspo", ("token_truncate", "token_mask")): TRL_GSPO_TOKEN_IS}
TOL = dict(rtol=1e-10, atol=1e-12)
# where verl and OpenRLHF divide each sequence's token sum by n + 1e-8 (seq-mean-token-mean; verl's geo_mean too): their
# arithmetic, not their formula, is off by a relative 1e-8 / n
EPS_TOL = dict(rtol=1e-7, atol=1e-12)
# TRL 1.16 defaults gradient_checkpointing=True, a name transformers 5.2x deprecates
pytestmark = pytest.mark.filterwarnings("ignore:.*gradient_checkpointing.*:FutureWarning")


_MENU = ("surrogate", "is_mode", "aggregation", "offpolicy_mask_delta")


@functools.lru_cache(maxsize=1)
def base_config():
    return from_dict(BASE)


def config_of(algo: dict):
    """BASE with these algorithm fields, each of its field's type (as from_dict gives it), validated as from_dict does
    (ConfigError) -- a fifth of from_dict's time over the grid."""
    a = base_config().algorithm
    fields = {k: type(getattr(a, k))(v) for k, v in algo.items()}
    cfg = dataclasses.replace(base_config(), algorithm=dataclasses.replace(a, **fields))
    validate(cfg)
    return cfg


def cell_name(peer: str, algo: dict) -> str:
    params = ",".join(f"{k}={v}" for k, v in algo.items() if k not in FIXED and k not in _MENU)
    opm = "-offpolicy_mask" if algo["offpolicy_mask_delta"] else ""
    return f"{peer}-{algo['surrogate']}{f'({params})' if params else ''}-{algo['is_mode']}-{algo['aggregation']}{opm}"


@functools.lru_cache(maxsize=1)
def all_cells() -> tuple[tuple[str, str, dict, dict], ...]:
    """(name, peer, algorithm settings, the peer's verdict per CELL_AXES) for every valid cell of the menus."""
    out = []
    for s, mode, agg, delta in itertools.product(Surrogate, ISMode, Aggregation, OFFPOLICY_DELTAS):
        for params in PARAMETERS.get(s.value, [{}]):
            algo = {"surrogate": s.value, "is_mode": mode.value, "aggregation": agg.value}
            algo = {**algo, "offpolicy_mask_delta": delta, **FIXED, **params}
            try:
                eq = equivalents(config_of(algo))
            except ConfigError:
                continue
            for peer in PEER_VERSIONS:
                out.append((cell_name(peer, algo), peer, algo, {a: eq[peer][a] for a in CELL_AXES}))
    return tuple(out)


EXACT_CELLS = [c for c in all_cells() if all(row["match"] == EXACT for row in c[3].values())]


def gradient_nearest(peer: str, algo: dict) -> str | None:
    for (p, surrogate, modes), phrase in GRADIENT_NEAREST.items():
        if (p, surrogate) == (peer, algo["surrogate"]) and algo["is_mode"] in modes:
            return phrase
    return None


NEAREST_CELLS = [c for c in all_cells() if gradient_nearest(c[1], c[2])]


def random_batch(seed: int) -> tuple[SimpleNamespace, torch.Tensor]:
    """Float64 log-probabilities (pi_theta, pi_old, the sampler's) of P*G ragged completions (one full), and [P*G]
    advantages of both signs. Probabilities stay in (0.02, 0.98), so DPPO's binary KL is finite."""
    g = torch.Generator().manual_seed(seed)
    rand = lambda: torch.rand(P * G, T, generator=g, dtype=torch.float64)  # noqa: E731
    noise = lambda s: s * torch.randn(P * G, T, generator=g, dtype=torch.float64)  # noqa: E731
    lengths = torch.randint(1, T + 1, (P * G,), generator=g)
    lengths[0] = T
    p = 0.05 + 0.9 * rand()
    logp = torch.log(p)
    old = torch.log((p * torch.exp(noise(0.3))).clamp(0.02, 0.98))
    sampler = torch.log((old.exp() * torch.exp(noise(0.25))).clamp(0.02, 0.98))
    adv = torch.randn(P * G, generator=g, dtype=torch.float64)
    batch = SimpleNamespace(
        logp=logp,
        old=old,
        ref=logp.detach().clone(),
        sampler=sampler,
        entropy=0.5 + rand(),
        mask=torch.arange(T) < lengths[:, None],
        lengths=lengths,
    )
    return batch, adv


def seeds(name: str) -> list[int]:
    return [zlib.crc32(name.encode()) % 2**31 + k for k in range(2)]


# --------------------------------------------------------------------------------------------- the peers' losses


@functools.lru_cache(maxsize=1)
def trl_is_block():
    """The importance-sampling block of GRPOTrainer._generate_and_score_completions (the vLLM path), compiled
    verbatim from the installed source: it sets vllm_importance_sampling_ratio from old_per_token_logps,
    sampling_per_token_logps, completion_mask and tool_mask."""
    import trl.trainer.grpo_trainer as module

    tree = ast.parse(Path(module.__file__).read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "GRPOTrainer")
    fn = next(n for n in cls.body if getattr(n, "name", None) == "_generate_and_score_completions")
    block = next(
        n
        for n in ast.walk(fn)
        if isinstance(n, ast.If)
        and ast.unparse(n.test) == "self.use_vllm and self.vllm_importance_sampling_correction"
        and "vllm_importance_sampling_ratio = torch.exp" in ast.unparse(n)
    )
    return compile(ast.Module(body=[block], type_ignores=[]), module.__file__, "exec")


@functools.lru_cache(maxsize=None)
def trl_trainer(settings: tuple, model_dir: str, out_dir: str):
    """GRPOTrainer with the card's settings; use_vllm is set on the trainer after construction (no vLLM here)."""
    import trl
    from datasets import Dataset
    from transformers import AutoTokenizer

    s = dict(settings)
    use_vllm = s.pop("use_vllm", False)
    conf = trl.GRPOConfig(
        output_dir=out_dir, **TRL_MACHINE, **s, model_init_kwargs={"dtype": "float32"}, shuffle_dataset=False
    )
    trainer = trl.GRPOTrainer(
        model=model_dir,
        reward_funcs=[lambda prompts, **_: [0.0] * len(prompts)],
        args=conf,
        train_dataset=Dataset.from_list([{"prompt": "w1 w2"}]),
        processing_class=AutoTokenizer.from_pretrained(model_dir),
    )
    trainer.use_vllm = use_vllm
    trainer.model.eval()  # one micro-batch, no gradient accumulation
    return trainer


def trl_loss(request, eq: dict, b, adv) -> torch.Tensor:
    """GRPOTrainer._compute_loss on the batch (its per-token log-probabilities stand in for the model's)."""
    pytest.importorskip("trl")
    model_dir, _ = request.getfixturevalue("tiny_model")
    assert eq["interface"] == "trl.GRPOConfig", "no gradient check of RLOOTrainer cells"
    out_dir = str(request.getfixturevalue("tmp_path_factory").getbasetemp() / "trl-grads")
    trainer = trl_trainer(tuple(sorted(peer_settings(eq).items())), model_dir, out_dir)
    trainer._get_per_token_logps_and_entropies = lambda *args, **kwargs: (b.logp, b.entropy, None)
    mask = b.mask.long()
    inputs = {
        "prompt_ids": torch.ones(P * G, 1, dtype=torch.long),
        "prompt_mask": torch.ones(P * G, 1, dtype=torch.long),
        "completion_ids": torch.ones(P * G, T, dtype=torch.long),
        "completion_mask": mask,
        "advantages": adv,
        "old_per_token_logps": b.old,
        "num_items_in_batch": b.mask.sum(),
    }
    if trainer.use_vllm:  # as the vLLM path hands them over: the sampler's log-probabilities, the IS ratio
        sampling = torch.where(b.mask, b.sampler, torch.zeros_like(b.sampler))
        scope = {"self": trainer, "completion_mask": mask, "tool_mask": None, "torch": torch, "math": math}
        scope.update(old_per_token_logps=b.old, sampling_per_token_logps=sampling)
        exec(trl_is_block(), scope)
        inputs.update(
            sampling_per_token_logps=sampling, importance_sampling_ratio=scope["vllm_importance_sampling_ratio"]
        )
    return trainer._compute_loss(trainer.model, inputs)


def flat(b, x: torch.Tensor) -> torch.Tensor:
    """verl's model output: one flat row per sequence (the response, then a zero for the prompt token)."""
    return torch.cat([torch.cat([x[i, :n], x.new_zeros(1)]) for i, n in enumerate(b.lengths.tolist())])


@functools.lru_cache(maxsize=None)
def verl_config(items: tuple, section: str):
    """verl's own dataclass of one config section (the actor, or the rollout correction) with the card's settings of
    that section (items) set on a copy of verl's default config, composed once by Hydra (a key its defaults lack
    raises; tests/test_card_peers.py composes the card's overrides themselves)."""
    from omegaconf import OmegaConf
    from verl.trainer.config.algorithm import RolloutCorrectionConfig
    from verl.utils.config import omega_conf_to_dataclass

    conf = copy.deepcopy(verl_compose({}))
    for key, value in items:
        OmegaConf.update(conf, key, value, force_add=False)
        assert OmegaConf.select(conf, key) == value, key
    if section == "algorithm.rollout_correction.":
        return omega_conf_to_dataclass(conf.algorithm.rollout_correction, RolloutCorrectionConfig)
    return omega_conf_to_dataclass(conf.actor_rollout_ref.actor)


def verl_loss(request, eq: dict, b, adv) -> torch.Tensor:
    """verl's rollout correction (its IS weights) and ppo_loss on the batch, from the card's Hydra overrides."""
    pytest.importorskip("verl.trainer.ppo.core_algos")
    from tensordict import TensorDict
    from verl import DataProto
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.losses import ppo_loss

    settings = sorted(peer_settings(eq).items())
    actor, correction = (
        verl_config(tuple((k, v) for k, v in settings if k.startswith(section)), section)
        for section in ("actor_rollout_ref.actor.", "algorithm.rollout_correction.")
    )
    data = DataProto.from_dict(
        tensors={"old_log_probs": b.old, "rollout_log_probs": b.sampler, "response_mask": b.mask.long()}
    )
    data, _ = compute_rollout_correction_and_add_to_batch(data, correction)
    tensors = {
        "prompts": torch.ones(P * G, 1, dtype=torch.long),
        "responses": torch.ones(P * G, T, dtype=torch.long),
        "attention_mask": torch.cat([torch.ones(P * G, 1, dtype=torch.long), b.mask.long()], 1),
        "response_mask": b.mask.long(),
        "old_log_probs": b.old,
        "advantages": adv[:, None].expand(-1, T).clone(),
    }
    if "rollout_is_weights" in data.batch.keys():
        tensors["rollout_is_weights"] = data.batch["rollout_is_weights"]
    td = TensorDict(tensors, batch_size=[P * G])
    tu.assign_non_tensor(td, dp_size=1, batch_num_tokens=int(b.mask.sum()), global_batch_size=P * G)
    return ppo_loss(actor, {"log_probs": flat(b, b.logp), "entropy": None}, td)[0]


def openrlhf_loss(request, eq: dict, b, adv) -> torch.Tensor:
    """OpenRLHF's PolicyLoss as ppo_actor.py builds it from the card's flags."""
    ns, _ = request.getfixturevalue("openrlhf")
    args = openrlhf_args(request.getfixturevalue("openrlhf"), peer_settings(eq))
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
    per_token = adv[:, None].expand(-1, T)
    return policy_loss(b.logp, b.old, per_token, action_mask=b.mask, rollout_log_probs=b.sampler)[0]


PEER_LOSS = {"trl": trl_loss, "verl": verl_loss, "openrlhf": openrlhf_loss}


def tolerance(peer: str, eq: dict) -> dict:
    settings = peer_settings(eq)
    token_means = {
        "verl": settings.get("actor_rollout_ref.actor.loss_agg_mode") == "seq-mean-token-mean"
        or settings.get("actor_rollout_ref.actor.policy_loss.loss_mode") in ("sapo", "geo_mean"),
        "openrlhf": settings.get("--actor.loss_agg_mode") == "seq-mean-token-mean"
        or settings.get("--actor.policy_loss_type") == "gspo",
    }
    return EPS_TOL if token_means.get(peer, False) else TOL


def as_the_peer_computes(peer: str, cfg):
    """cfg with the numbers the peer's arithmetic holds: TRL's torch.where of two Python floats makes the SAPO
    temperatures float32 (1.05 becomes 1.05 - 5e-8)."""
    a, f32 = cfg.algorithm, lambda x: float(torch.tensor(x, dtype=torch.float32))
    if peer == "trl" and a.surrogate == "sapo":
        return with_algorithm(cfg, sapo_tau_pos=f32(a.sapo_tau_pos), sapo_tau_neg=f32(a.sapo_tau_neg))
    return cfg


def value_and_gradient(request, peer: str, cfg, eq: dict, seed: int):
    """(ours, theirs): the loss and its gradient with respect to the log-probabilities, for grpolab and the peer."""
    b, adv = random_batch(seed)
    b.logp.requires_grad_(True)
    out = []
    for loss in (grpolab_loss(as_the_peer_computes(peer, cfg), b, adv), PEER_LOSS[peer](request, eq, b, adv)):
        (grad,) = torch.autograd.grad(loss, b.logp)
        out.append((loss.detach().double(), grad.double()))
    return out


# --------------------------------------------------------------------------------------------- the tests


def test_the_cells_cover_the_menus_and_every_peer():
    """Every surrogate, IS mode and aggregation is put to the card; each peer has exact cells, and every exact cell
    has a peer loss here (a peer without one would fail, not skip)."""
    names = {c[0] for c in all_cells()}
    assert len(names) == len(all_cells())
    assert {c[2]["surrogate"] for c in all_cells()} == {s.value for s in Surrogate}
    assert {c[2]["is_mode"] for c in all_cells()} == {m.value for m in ISMode}
    assert {c[2]["aggregation"] for c in all_cells()} == {a.value for a in Aggregation}
    assert {c[1] for c in EXACT_CELLS} == set(PEER_VERSIONS) == set(PEER_LOSS)
    assert NEAREST_CELLS and all(c not in EXACT_CELLS for c in NEAREST_CELLS)


@pytest.mark.parametrize("cell", EXACT_CELLS, ids=[c[0] for c in EXACT_CELLS])
def test_exact_cell_value_and_gradient(cell, request, one_thread):
    """The card says exact: the loss and d loss / d log pi_theta equal the peer's, in float64, on two random batches."""
    name, peer, algo, _ = cell
    cfg = config_of(algo)
    eq = equivalents(cfg)[peer]
    assert all(eq[a]["match"] == EXACT for a in (*CELL_AXES, "kl", "entropy")), name
    moving = 0
    for seed in seeds(name):
        (ours, d_ours), (theirs, d_theirs) = value_and_gradient(request, peer, cfg, eq, seed)
        torch.testing.assert_close(ours, theirs, **tolerance(peer, eq), msg=f"{name}: loss")
        torch.testing.assert_close(d_ours, d_theirs, **tolerance(peer, eq), msg=f"{name}: gradient")
        moving += int((d_ours != 0).sum())
    assert moving > 0, f"{name}: no token has a gradient on either batch"


@pytest.mark.parametrize("cell", NEAREST_CELLS, ids=[c[0] for c in NEAREST_CELLS])
def test_gradient_nearest_cell(cell, request, one_thread):
    """A cell whose gradient differs from the peer's is nearest on the card, with the reason; the values agree and
    the gradients do not (were they to agree, the cell would be exact again)."""
    name, peer, algo, rows = cell
    phrase = gradient_nearest(peer, algo)
    assert rows["importance_sampling"]["match"] == NEAREST, name
    assert phrase in rows["importance_sampling"]["difference"], name
    cfg = config_of(algo)
    eq = equivalents(cfg)[peer]
    if any(eq[a]["match"] != EXACT for a in CELL_AXES if a != "importance_sampling"):
        return  # another row differs too: nothing here to compute
    differs = False
    for seed in seeds(name):
        (ours, d_ours), (theirs, d_theirs) = value_and_gradient(request, peer, cfg, eq, seed)
        torch.testing.assert_close(ours, theirs, **tolerance(peer, eq), msg=f"{name}: loss")
        differs |= not torch.allclose(d_ours, d_theirs, rtol=1e-6, atol=1e-9)
    assert differs, f"{name}: the gradients agree; the card could call this cell exact"
