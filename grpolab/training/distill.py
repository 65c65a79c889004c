"""On-policy distillation (algorithm.estimator = distill; docs/distillation.md): the student (the policy) samples its
G completions per prompt as usual, a frozen teacher scores the student's own tokens in one no-grad forward pass, and
each token's advantage is the negative per-token reverse KL, sampled at the student's token:

    A_it = log pi_T(o_it | q, o_i,<t) - log pi_old(o_it | q, o_i,<t)   (+ reward_weight * A_i)

with pi_old the student at the start of the update (the update's pi_old: the student that sampled when training is
synchronous, a newer one with rollout.max_staleness > 0), A_i the group advantage of the task reward
(grpolab.training.batch) and A_it = 0 outside the trained tokens. The update is the configured surrogate with these
per-token advantages (grpolab.training.update). Its policy gradient, -sum_t A_it grad log pi(o_it), is the
discount-0 approximation of the reverse KL's gradient: each token's own term log pi_T - log pi, without the sum of
the later tokens' terms that the exact gradient of KL(pi || pi_T) over the sequence carries. It lowers the reverse
KL one sampled token at a time (Agarwal et al., "On-Policy Distillation of
Language Models" (GKD), 2024; Thinking Machines, "On-Policy Distillation", 2025). Both log-probabilities are taken
at rollout.temperature, as pi_old is everywhere in the loop, and with the same precision (train.precision's autocast
and attention kernels), so a teacher equal to the student gives A = 0 exactly.

- ``distill_advantages``: the formula above (pure torch);
- ``distill_sums``: the sums behind the metrics ``distill/reverse_kl`` and ``distill/teacher_logp``;
- ``tokenizer_difference`` / ``check_same_tokenizer``: the student's token ids mean the same to the teacher, or
  the run is refused;
- ``check_distill_config``: the combinations refused (no teacher or a teacher path that is no model, found before
  any model loads; dynamic sampling; KL in the reward);
- ``load_teacher``: the teacher model (hub id, local path, ``bundled:`` alias, a ``grpolab train`` run directory or
  ``RUN:best``), frozen, in distill.dtype, on the training device.
"""

from __future__ import annotations

import torch

from ..config import Config
from ..errors import ConfigError, GrpolabError
from ..models.load import check_model_name, load_causal_lm, resolve_model_path

METRICS = ("distill/reverse_kl", "distill/teacher_logp")


def distill_advantages(
    teacher_logp: torch.Tensor,
    old_logp: torch.Tensor,
    mask: torch.Tensor,
    group_advantages: torch.Tensor | None = None,
    reward_weight: float = 0.0,
) -> torch.Tensor:
    """Per-token advantages [N, T] of on-policy distillation:

        A_it = m_it * ( (log pi_T(o_it) - log pi_old(o_it)) + reward_weight * A_i )

    teacher_logp, old_logp: [N, T] log-probabilities of the sampled tokens under the teacher and the sampling
    student; mask: [N, T] the trained tokens (m_it); group_advantages: [N] the task reward's group advantages A_i
    (used only when reward_weight != 0). Computed in float64, returned in old_logp's dtype; no gradient flows.

    >>> distill_advantages(torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.5, -1.0]]), torch.tensor([[1, 0]]))
    tensor([[0.5000, 0.0000]])
    """
    if teacher_logp.shape != old_logp.shape or mask.shape != old_logp.shape:
        raise ValueError(
            f"distill_advantages: teacher_logp {tuple(teacher_logp.shape)}, old_logp {tuple(old_logp.shape)} and "
            f"mask {tuple(mask.shape)} must have the same shape [N, T]"
        )
    adv = teacher_logp.detach().double() - old_logp.detach().double()
    if reward_weight != 0.0:
        if group_advantages is None or group_advantages.shape != old_logp.shape[:1]:
            got = None if group_advantages is None else tuple(group_advantages.shape)
            raise ValueError(f"distill_advantages: reward_weight needs group_advantages of shape [N], got {got}")
        adv = adv + reward_weight * group_advantages.detach().double().to(adv.device)[:, None]
    return torch.where(mask.bool(), adv, 0.0).to(old_logp.dtype)  # exactly 0 (not -0.0) off the mask


def distill_sums(teacher_logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """float64 [3]: sum_it m_it (log pi_old - log pi_T), sum_it m_it log pi_T, sum_it m_it -- summed over the ranks,
    the first two divided by the third are distill/reverse_kl (the sampled reverse KL per trained token, k1 at the
    student's tokens) and distill/teacher_logp."""
    m = mask.double()
    t, s = teacher_logp.double(), old_logp.double()
    return torch.stack([((s - t) * m).sum(), (t * m).sum(), m.sum()])


def distill_metrics(sums: torch.Tensor) -> dict[str, float]:
    """The metrics of distill_sums (summed over every rank); 0 when no token was trained."""
    tokens = float(sums[2].clamp(min=1))
    return {METRICS[0]: float(sums[0]) / tokens, METRICS[1]: float(sums[1]) / tokens}


# ---------------------------------------------------------------------------------------------------- the teacher


def tokenizer_difference(student, teacher) -> str | None:
    """The first way two tokenizers differ (vocabulary, then the special tokens and their ids), or None when the
    student's token ids mean the same to the teacher. A pad token the student's loader set to eos is not compared
    (only the pad of a tokenizer that declares one)."""
    sv, tv = student.get_vocab(), teacher.get_vocab()
    if sv != tv:
        only_s = sorted(set(sv) - set(tv))
        only_t = sorted(set(tv) - set(sv))
        moved = sorted(k for k in set(sv) & set(tv) if sv[k] != tv[k])
        if only_s or only_t:
            return (
                f"vocabularies differ ({len(sv)} vs {len(tv)} tokens; only in the student's: {only_s[:3]}, only in "
                f"the teacher's: {only_t[:3]})"
            )
        return f"token ids differ ({len(moved)} tokens, first {moved[0]!r}: {sv[moved[0]]} vs {tv[moved[0]]})"
    for name in ("bos_token", "eos_token", "unk_token"):
        a, b = getattr(student, name, None), getattr(teacher, name, None)
        if a != b:
            return f"{name} differs ({a!r} vs {b!r})"
    sa, ta = sorted(map(str, student.all_special_tokens)), sorted(map(str, teacher.all_special_tokens))
    pad = {str(student.pad_token)} - set(ta) if teacher.pad_token is None else set()
    if [t for t in sa if t not in pad] != ta:
        return f"special tokens differ ({sorted(set(sa) ^ set(ta))[:4]} in only one of them)"
    return None


def check_same_tokenizer(student, teacher, student_name: str, teacher_name: str) -> None:
    """Refuse a teacher whose tokenizer differs from the student's (ConfigError naming both models)."""
    difference = tokenizer_difference(student, teacher)
    if difference is not None:
        raise ConfigError(
            f"distill.teacher: the teacher {teacher_name} and the student {student_name} (model.name) must use the "
            f"same tokenizer -- the teacher scores the student's token ids -- but their {difference}"
        )


def check_distill_config(cfg: Config) -> None:
    """The settings on-policy distillation cannot run with, refused with the field to change."""
    a = cfg.algorithm
    if not cfg.distill.teacher:
        raise ConfigError(
            "distill.teacher: expected the teacher model (a hub id, a local path, bundled:<alias> or a grpolab train "
            "run directory) with algorithm.estimator distill, got ''"
        )
    check_model_name(cfg.distill.teacher, "distill.teacher")  # before any model loads: a missing path is named here
    if a.dynamic_sampling:
        raise ConfigError(
            "algorithm.dynamic_sampling: expected false with algorithm.estimator distill (a group whose rewards are "
            "all equal still carries the teacher's per-token signal; dropping it would waste it)"
        )
    if a.beta > 0 and a.kl_placement == "reward":
        raise ConfigError(
            "algorithm.kl_placement: expected loss with algorithm.estimator distill and beta > 0 (the distillation "
            "advantage is per token; a KL folded into the sequence reward would only act through distill.reward_weight)"
        )


def load_teacher(cfg: Config, student_tokenizer, student_path: str, device: torch.device):
    """The frozen teacher of cfg.distill on `device`, in eval mode, its tokenizer checked against the student's."""
    from transformers import AutoTokenizer

    name = cfg.distill.teacher
    path = resolve_model_path(name, "distill.teacher")
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as e:
        raise GrpolabError(
            f"distill.teacher: cannot load a tokenizer from {path!r} ({str(e).splitlines()[0]})"
        ) from None
    shown = name if path == name else f"{name} ({path})"
    check_same_tokenizer(student_tokenizer, tokenizer, student_path, shown)
    try:
        model = load_causal_lm(path, cfg.distill.dtype)
    except GrpolabError as e:
        raise GrpolabError(f"distill.teacher: {e}") from None
    model.requires_grad_(False)  # never trained: no gradient buffers, no optimizer state
    return model.to(device).eval()
