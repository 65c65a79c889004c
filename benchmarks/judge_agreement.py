#!/usr/bin/env python
"""How well a judge agrees with the verifier, before any training on it (docs/judges.md, "Measured").

    python benchmarks/judge_agreement.py configs/judge_quickstart.yaml --problems 40 --samples 4 \
        --rubric configs/judge_rubric.txt --rubric configs/judge_rubric_noref.txt

The policy of the config (`model.name`) answers the first `--problems` training problems of its task `--samples`
times each (temperature `rollout.temperature`, `rollout.max_new_tokens`, seeded, float32); math-verify
(grpolab.rewards.math.correctness_reward) marks each answer right or wrong; the config's judge (`reward.judge`,
with each `--rubric` in turn and the cache off, so every judgement is computed and timed) scores every answer.
Printed per rubric, over the answers the judge scored (unparseable ones are counted, not dropped silently):

- AUC = P(score of a right answer > score of a wrong one) + P(tie) / 2, Hanley-McNeil 95% interval
  (grpolab.gate.judge.auc_interval): 0.5 is a judge that cannot tell right from wrong;
- accuracy of `score >= 0.5` as the verdict "right", Wilson 95% interval, beside the accuracy of the constant
  verdict "wrong" (the share of wrong answers) -- a judge whose accuracy equals that constant has learned nothing;
- seconds per 1,000 judgements (wall time of the judge calls alone, on this machine, in the judge's dtype).

The same answers are judged by every rubric, so the rubrics are compared on identical samples.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import torch
from common import cpu_features

from grpolab.config import load_config
from grpolab.gate.judge import auc_interval, wilson
from grpolab.models.load import load_causal_lm, load_tokenizer, resolve_model_path
from grpolab.rewards.judge import JudgeReward
from grpolab.rewards.math import correctness_reward
from grpolab.tasks import make_task
from grpolab.tasks.prompting import prompt_ids


def sample_answers(cfg, problems, samples: int, seed: int) -> list[tuple[object, str]]:
    """(problem, answer text) for `samples` answers to each problem, drawn from the config's policy in float32."""
    path = resolve_model_path(cfg.model.name)
    tok, model = load_tokenizer(path), load_causal_lm(path, "float32")
    torch.manual_seed(seed)
    out = []
    for p in problems:
        ids = torch.tensor([prompt_ids(tok, p)])
        with torch.no_grad():
            gen = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=True,
                top_k=0,
                top_p=1.0,
                temperature=cfg.rollout.temperature,
                max_new_tokens=cfg.rollout.max_new_tokens,
                num_return_sequences=samples,
                pad_token_id=tok.pad_token_id or tok.eos_token_id,
            )
        out += [(p, tok.decode(g[ids.shape[1] :], skip_special_tokens=True)) for g in gen]
    return out


def agreement(judge: JudgeReward, answers: list[tuple[object, str]]) -> dict:
    """Judge every answer once; the agreement of its scores with math-verify (module docstring)."""
    problems, texts = [p for p, _ in answers], [a for _, a in answers]
    right = [correctness_reward(a, p.answer) >= 1.0 for p, a in answers]
    start = time.perf_counter()
    scored = judge(texts, problems)
    seconds = time.perf_counter() - start
    valid = [(s.value, r) for s, r in zip(scored, right) if s.value is not None]
    pos, neg = [v for v, r in valid if r], [v for v, r in valid if not r]
    hits = sum((v >= 0.5) == r for v, r in valid)
    return {
        "answers": len(answers),
        "right": sum(right),
        "scored": len(valid),
        "scored_right": len(pos),
        "auc": auc_interval(pos, neg) if pos and neg else None,
        "accuracy": hits / len(valid) if valid else None,
        "accuracy_ci": wilson(hits, len(valid)) if valid else None,
        "constant_wrong_accuracy": len(neg) / len(valid) if valid else None,
        "seconds_per_1000": 1000 * seconds / len(answers),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("config")
    ap.add_argument("--problems", type=int, default=40)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--rubric", action="append", help="rubric file(s) to compare (default: the config's)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, help="write the results as JSON")
    args = ap.parse_args()
    cfg = load_config(args.config)
    task = make_task(cfg.task.name, **dict(cfg.task.options))
    answers = sample_answers(cfg, task.problems("train")[: args.problems], args.samples, args.seed)
    judge_options = dataclasses.asdict(cfg.reward.judge)
    results = {"cpu": cpu_features(), "config": args.config, "rubrics": {}}
    for rubric in args.rubric or [judge_options["rubric"]]:
        judge = JudgeReward({**judge_options, "rubric": rubric, "cache": "off"})
        r = results["rubrics"][rubric] = agreement(judge, answers)
        auc, nan = r["auc"] or {}, float("nan")
        accuracy, constant = (nan if r[k] is None else r[k] for k in ("accuracy", "constant_wrong_accuracy"))
        print(
            f"{rubric}: scored {r['scored']}/{r['answers']} ({r['scored_right']} right of {r['right']}); "
            f"AUC {auc.get('auc', nan):.3f} [{auc.get('ci_low', nan):.3f}, {auc.get('ci_high', nan):.3f}]; "
            f"accuracy {accuracy:.3f} (constant 'wrong': {constant:.3f}); "
            f"{r['seconds_per_1000']:.0f} s per 1,000 judgements"
        )
    print(f"cpu: {results['cpu']}")
    if args.out:
        args.out.write_text(json.dumps(results, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
