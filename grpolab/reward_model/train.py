"""`grpolab rm train`: a Bradley-Terry reward model -- a scalar head on a causal-LM backbone, full or LoRA -- trained
on preference pairs, evaluated by held-out pair accuracy, written to a run directory.

    RUN_DIR/manifest.json        kind "reward_model": settings, hashes (backbone, tokenizer, pairs), data summary,
                                 the held-out problems checked against, versions, git, result
    RUN_DIR/metrics.jsonl        one row per optimizer step: rm/loss, rm/accuracy, rm/margin, optim/lr, time/step_s
    RUN_DIR/pairs/{train,val}.jsonl   the pairs trained on and held out (validation: whole prompts held out)
    RUN_DIR/eval/pair_accuracy.json   validation pair accuracy with its 95% interval, before and after training
    RUN_DIR/model/               the reward model (Hugging Face AutoModelForSequenceClassification, num_labels = 1;
                                 a LoRA model merged), what `reward.model.path: RUN_DIR` loads

The model: ``AutoModelForSequenceClassification.from_pretrained(backbone, num_labels=1)`` -- the backbone's
transformer plus a new linear score head (seeded). Each step scores the chosen and rejected texts of
``batch_size`` pairs (grpolab.rewards.model.rm_text / encode / forward_scores: exactly how the `model` reward scores
them) and takes an AdamW step on the Bradley-Terry loss (grpolab.reward_model.loss).
"""

from __future__ import annotations

import dataclasses
import random
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from .. import manifest as mf
from ..errors import ConfigError, GrpolabError
from ..rewards.model import RM_KIND, RM_SUBDIR, encode, forward_scores, rm_text
from ..training.metrics import JsonlSink
from .loss import bradley_terry_loss, pair_accuracy_interval, pair_outcomes
from .pairs import (
    PreferencePair,
    check_disjoint,
    load_pairs_jsonl,
    pairs_hash,
    split_by_prompt,
    task_pairs,
    training_problems,
    write_pairs_jsonl,
)


@dataclass(frozen=True)
class RMSettings:
    """Everything `grpolab rm train` is asked for (CLI options of the same names)."""

    backbone: str = "bundled:smollm2-135m-instruct"
    pairs: str = ""  # a JSONL file of pairs; else built from `task`
    task: str = ""
    task_options: dict = field(default_factory=dict)
    sampler: str = ""  # the model whose samples make the pairs ("" = the backbone)
    num_problems: int = 128
    samples_per_problem: int = 8
    max_new_tokens: int = 48
    temperature: float = 0.8
    max_pairs_per_problem: int = 4
    val_fraction: float = 0.2
    epochs: int = 1
    batch_size: int = 8  # pairs per optimizer step
    lr: float = 1e-5
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    max_length: int = 512
    lora_rank: int = 0
    lora_alpha: float = 16.0
    seed: int = 0
    device: str = "auto"
    output_dir: str = "runs"
    name: str = ""

    def check(self) -> None:
        """ConfigError naming the option for a value out of range or a missing pair source."""
        if bool(self.pairs) == bool(self.task):
            raise ConfigError(
                "--pairs / --task: give exactly one source of preference pairs (a JSONL file, or a task "
                "whose samples and verifier build them)"
            )
        ranges = {
            "num_problems": self.num_problems >= 1,
            "samples_per_problem": self.samples_per_problem >= 2,
            "max_new_tokens": self.max_new_tokens >= 1,
            "temperature": self.temperature > 0,
            "max_pairs_per_problem": self.max_pairs_per_problem >= 1,
            "val_fraction": 0 <= self.val_fraction < 1,
            "epochs": self.epochs >= 1,
            "batch_size": self.batch_size >= 1,
            "lr": self.lr > 0,
            "max_length": self.max_length >= 8,
            "lora_rank": self.lora_rank >= 0,
        }
        bad = [k for k, ok in ranges.items() if not ok]
        if bad:
            raise ConfigError(
                f"--{bad[0].replace('_', '-')}: out of range ({getattr(self, bad[0])!r}); see `grpolab rm train --help`"
            )


# ----------------------------------------------------------------------------------------------- the model


def load_rm_backbone(backbone: str, s: RMSettings, device: torch.device):
    """(model, tokenizer): the backbone with a fresh scalar score head (seeded), LoRA adapters when lora_rank > 0
    (peft task SEQ_CLS: the head itself is trained in full)."""
    from transformers import AutoModelForSequenceClassification

    from ..models.load import load_tokenizer, resolve_model_path

    path = resolve_model_path(backbone)
    tokenizer = load_tokenizer(path)
    torch.manual_seed(s.seed)
    try:
        model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1)
    except (OSError, ValueError) as e:
        raise GrpolabError(
            f"--backbone: cannot build a sequence-classification model from {backbone!r} ({str(e).splitlines()[0]})"
        ) from None
    model.config.pad_token_id = tokenizer.pad_token_id
    if s.lora_rank:
        import peft

        config = peft.LoraConfig(
            r=s.lora_rank, lora_alpha=s.lora_alpha, target_modules="all-linear", task_type="SEQ_CLS"
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # peft asks transformers 5 a deprecated question
            model = peft.get_peft_model(model, config)
    return model.to(device), tokenizer, path


def score_pairs(
    model, tokenizer, pairs: Sequence[PreferencePair], max_length: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """(chosen scores, rejected scores) [N] of `pairs`, in one forward pass over 2N sequences."""
    texts = [rm_text(tokenizer, q.prompt, q.chosen) for q in pairs] + [
        rm_text(tokenizer, q.prompt, q.rejected) for q in pairs
    ]
    ids, mask = encode(tokenizer, texts, max_length)
    scores = forward_scores(model, ids.to(device), mask.to(device))
    return scores[: len(pairs)], scores[len(pairs) :]


@torch.no_grad()
def evaluate_pairs(
    model, tokenizer, pairs: Sequence[PreferencePair], max_length: int, device: torch.device, batch_size: int = 16
) -> dict[str, Any]:
    """Pair accuracy of `model` on `pairs` with its 95% cluster-bootstrap interval (prompts resampled) and the mean
    margin r_c - r_r."""
    was_training = model.training
    model.eval()
    chosen: list[float] = []
    rejected: list[float] = []
    for i in range(0, len(pairs), batch_size):
        c, r = score_pairs(model, tokenizer, pairs[i : i + batch_size], max_length, device)
        chosen += c.tolist()
        rejected += r.tolist()
    model.train(was_training)
    out = pair_accuracy_interval(pair_outcomes(chosen, rejected), [q.uid for q in pairs])
    out["margin_mean"] = sum(c - r for c, r in zip(chosen, rejected)) / len(pairs)
    return out


def fit(
    model,
    tokenizer,
    pairs: Sequence[PreferencePair],
    s: RMSettings,
    device: torch.device,
    log: Callable[[int, dict[str, float]], None] = lambda step, m: None,
) -> int:
    """s.epochs passes of AdamW on the Bradley-Terry loss, s.batch_size pairs per step, pairs shuffled with s.seed;
    returns the number of optimizer steps."""
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=s.lr, weight_decay=s.weight_decay)
    rng, step = random.Random(s.seed), 0
    model.train()
    for _ in range(s.epochs):
        order = list(pairs)
        rng.shuffle(order)
        for i in range(0, len(order), s.batch_size):
            t0 = time.perf_counter()
            batch = order[i : i + s.batch_size]
            chosen, rejected = score_pairs(model, tokenizer, batch, s.max_length, device)
            loss = bradley_terry_loss(chosen, rejected)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(params, s.grad_clip) if s.grad_clip else torch.tensor(0.0)
            optimizer.step()
            step += 1
            outcomes = pair_outcomes(chosen.tolist(), rejected.tolist())
            log(
                step,
                {
                    "rm/loss": loss.item(),
                    "rm/accuracy": sum(outcomes) / len(outcomes),
                    "rm/margin": (chosen - rejected).mean().item(),
                    "optim/grad_norm": float(grad_norm),
                    "optim/lr": s.lr,
                    "time/step_s": time.perf_counter() - t0,
                },
            )
    model.eval()
    return step


def save_rm(model, tokenizer, directory: Path) -> None:
    """The reward model as a plain Hugging Face model (LoRA merged into its weights) with its tokenizer."""
    from ..models.lora import is_lora

    plain = model.merge_and_unload() if is_lora(model) else model
    plain.save_pretrained(directory)
    tokenizer.save_pretrained(directory)


# ----------------------------------------------------------------------------------------------- pairs and run


def plan_rm_dir(s: RMSettings) -> Path:
    name = s.name or f"rm-{s.task or Path(s.pairs).stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    path = Path(s.output_dir) / name
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise GrpolabError(f"--name: {path} already exists and is not empty; choose another name")
    return path


def sample_with(model_name: str, s: RMSettings, device: torch.device) -> Callable[[list], list[list[str]]]:
    """generate(problems) -> s.samples_per_problem completions each, sampled by `model_name` (temperature
    s.temperature, s.max_new_tokens new tokens) with the seed s.seed."""
    from ..evaluation.heldout import generate_all
    from ..models.load import load_causal_lm, load_tokenizer, resolve_model_path
    from ..rollout.base import SamplingParams
    from ..rollout.grpolab_engine import GrpolabEngine

    def generate(problems: list) -> list[list[str]]:
        path = resolve_model_path(model_name)
        tokenizer, model = load_tokenizer(path), load_causal_lm(path).to(device).eval()
        engine = GrpolabEngine(model, tokenizer, torch.float32)
        params = SamplingParams(
            group_size=s.samples_per_problem, temperature=s.temperature, max_new_tokens=s.max_new_tokens, logprobs=False
        )
        torch.manual_seed(s.seed)
        out = generate_all(engine, tokenizer, problems, params, batch_size=64)
        return [[c.text for c in group] for group in out]

    return generate


def build_pairs(s: RMSettings, device: torch.device, generate: Callable | None = None) -> tuple[list, dict[str, Any]]:
    """(pairs, data summary) from s.pairs or from s.task (training problems only; the held-out split is checked
    to be disjoint from every pair's prompt)."""
    if s.pairs:
        pairs = load_pairs_jsonl(s.pairs)
        return pairs, {"source": s.pairs, "pairs": len(pairs)}
    from ..tasks import make_task

    task = make_task(s.task, **s.task_options)
    problems = training_problems(task, s.num_problems, s.seed)
    pairs, summary = task_pairs(
        problems, generate or sample_with(s.sampler or s.backbone, s, device), s.max_pairs_per_problem
    )
    held_out = list(task.problems("test"))
    summary["held_out_checked"] = check_disjoint(pairs, held_out)
    summary.update(
        source=f"task {s.task}",
        task_options=dict(s.task_options),
        sampler=s.sampler or s.backbone,
        problem_hashes=mf.problem_hashes(problems),
        held_out_hash=mf.data_hash(held_out),
    )
    if len(pairs) < 2:
        raise GrpolabError(
            f"--task {s.task}: only {len(pairs)} preference pair(s) from {len(problems)} problems (the "
            "sampler's answers were all right or all wrong); raise --num-problems or --samples-per-problem"
        )
    return pairs, summary


def train_reward_model(
    s: RMSettings, generate: Callable | None = None, on_log: Callable[[str], None] = lambda text: None
) -> dict[str, Any]:
    """The whole command: pairs -> split -> train -> evaluate -> save; returns the manifest (with ``run_dir``).
    ``generate`` replaces the sampler for task pairs (tests)."""
    from ..training.distributed import resolve_device

    s.check()
    device = resolve_device(s.device)
    run_dir = plan_rm_dir(s)
    on_log("building preference pairs")
    pairs, data = build_pairs(s, device, generate)
    train, val = split_by_prompt(pairs, s.val_fraction, s.seed)
    model, tokenizer, backbone_path = load_rm_backbone(s.backbone, s, device)
    (run_dir / "pairs").mkdir(parents=True, exist_ok=True)
    (run_dir / "eval").mkdir(exist_ok=True)
    write_pairs_jsonl(train, run_dir / "pairs" / "train.jsonl")
    write_pairs_jsonl(val, run_dir / "pairs" / "val.jsonl")
    before = evaluate_pairs(model, tokenizer, val, s.max_length, device) if val else None
    on_log(f"training on {len(train)} pairs ({len(val)} held out)")
    sink = JsonlSink(run_dir / "metrics.jsonl")
    t0 = time.perf_counter()
    try:
        steps = fit(model, tokenizer, train, s, device, sink.log)
    finally:
        sink.close()
    after = evaluate_pairs(model, tokenizer, val, s.max_length, device) if val else None
    result = {
        "val_pairs": len(val),
        "train_pairs": len(train),
        "before": before,
        "after": after,
        "steps": steps,
        "train_s": round(time.perf_counter() - t0, 1),
    }
    mf.write_json_atomic(run_dir / "eval" / "pair_accuracy.json", result)
    save_rm(model, tokenizer, run_dir / RM_SUBDIR)
    manifest = rm_manifest(s, backbone_path, tokenizer, train, val, data, result)
    mf.write_json_atomic(run_dir / "manifest.json", manifest)
    return {**manifest, "run_dir": str(run_dir)}


def rm_manifest(
    s: RMSettings, backbone_path: str, tokenizer, train: list, val: list, data: dict[str, Any], result: dict[str, Any]
) -> dict[str, Any]:
    hashes = mf.hash_model_dir(backbone_path)
    return {
        "grpolab_manifest": 1,
        "kind": RM_KIND,
        "command": " ".join(["grpolab", *sys.argv[1:]]),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "settings": dataclasses.asdict(s),
        "objective": "Bradley-Terry: L = -mean log sigmoid(r(x, y_chosen) - r(x, y_rejected)); "
        + ("LoRA (rank %d) + score head" % s.lora_rank if s.lora_rank else "full fine-tuning + score head"),
        "hashes": {
            "backbone_weights": hashes["weights"],
            "tokenizer": hashes["tokenizer"],
            "chat_template": mf.sha256_bytes((tokenizer.chat_template or "").encode()),
            "train_pairs": pairs_hash(train),
            "val_pairs": pairs_hash(val),
        },
        "data": data,
        "result": result,
        "backbone_path": backbone_path,
        "versions": mf.versions(),
        "git": mf.git_state(),
        "machine": mf.machine(),
    }


def summary_line(result: dict[str, Any]) -> str:
    """'held-out pair accuracy 0.71 [0.62, 0.80] (n = 48 pairs; before training 0.52 [...])'."""
    a, b = result.get("after"), result.get("before")
    if not a:
        return f"no held-out pairs (--val-fraction 0): {result['train_pairs']} pairs trained on"
    fmt = lambda d: f"{d['accuracy']:.3f} [{d['ci_low']:.3f}, {d['ci_high']:.3f}]"  # noqa: E731
    return (
        f"held-out pair accuracy {fmt(a)} (n = {a['n']} pairs of unseen prompts; before training {fmt(b)}), "
        f"{result['train_pairs']} pairs trained on in {result['steps']} steps"
    )


__all__ = [
    "RMSettings",
    "evaluate_pairs",
    "fit",
    "load_rm_backbone",
    "score_pairs",
    "summary_line",
    "train_reward_model",
]
