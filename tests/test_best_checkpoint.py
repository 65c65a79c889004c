"""The checkpoint to ship is picked by held-out evidence, never by training reward: checkpoints/best.json names the
step with the highest periodic held-out accuracy (ties keep the earlier), keep_last never prunes it, a resume agrees
with it, and `RUN:best` resolves to it wherever a model path is read."""

from __future__ import annotations

import json
import math

import earnable
import pytest

from grpolab.config import from_dict
from grpolab.errors import GrpolabError
from grpolab.models import checkpoint as ckpt
from grpolab.models.load import resolve_model_path
from grpolab.runs import resume_run, start_run
from grpolab.training.metrics import read_jsonl

pytestmark = pytest.mark.usefixtures("one_thread")


def test_select_best_takes_the_highest_held_out_value_and_the_earlier_step_on_a_tie():
    assert ckpt.select_best([(2, 0.6), (4, 0.4), (6, 0.2)]) == (2, 0.6)  # held-out falls: the early step
    assert ckpt.select_best([(2, 0.5), (4, 0.5), (6, 0.5)]) == (2, 0.5)  # a tie keeps the earlier
    assert ckpt.select_best([(2, math.nan), (4, 0.1), (6, math.nan)]) == (4, 0.1)  # NaN is no evidence
    assert ckpt.select_best([(2, math.nan)]) is None and ckpt.select_best([]) is None


def config(model_dir: str, out, name: str, steps: int = 6) -> dict:
    return {
        "model": {"name": model_dir},
        "task": {"name": "arithmetic", "options": {"num_train": 50, "num_test": 20}},
        "reward": earnable.reward_config(),
        "rollout": earnable.rollout_config(group_size=4),
        "algorithm": {"preset": "grpo", "beta": 0.0, "entropy_coef": 0.0},
        "train": {
            "steps": steps,
            "prompts_per_step": 2,
            "micro_batch_size": 8,
            "lr": 5e-3,
            "seed": 0,
            "samples_per_step": 1,
            "save_every": 1,
            "save_every_minutes": 0,
            "keep_last": 1,
        },
        "eval": {"every_steps": 2, "num_problems": 2, "max_new_tokens": 2},
        "run": {"output_dir": str(out), "name": name},
    }


def plant_heldout(monkeypatch, trainer, accuracies: dict[int, float]) -> None:
    """The periodic eval returns a planted held-out accuracy per step (interval +-0.1 around it)."""

    def planted():
        a = accuracies[trainer.step]
        return {"eval/accuracy": a, "eval/ci_low": a - 0.1, "eval/ci_high": a + 0.1}

    monkeypatch.setattr(trainer, "eval_metrics", planted)


def test_reward_rises_while_held_out_falls_the_early_checkpoint_is_the_best(tiny_model_dir, tmp_path, monkeypatch):
    trainer, _ = start_run(from_dict(config(tiny_model_dir, tmp_path, "falls")))
    plant_heldout(monkeypatch, trainer, {2: 0.75, 4: 0.5, 6: 0.25})
    trainer.fit()
    run = tmp_path / "falls"
    rows = read_jsonl(run / "metrics.jsonl")
    reward = {r["step"]: r["reward/mean"] for r in rows}
    # the premise: a pick by training reward at the evaluated steps would not be step 2 (reward rose after it) ...
    assert max(reward[4], reward[6]) > reward[2], list(reward.values())
    assert [r["eval/accuracy"] for r in rows if "eval/accuracy" in r] == [0.75, 0.5, 0.25]  # ... held-out fell
    best = ckpt.best_record(run)
    assert (best["step"], best["value"], best["ci_low"], best["metric"]) == (2, 0.75, 0.65, "eval/accuracy")
    assert best["training_reward"] == reward[2]
    # keep_last = 1 keeps the newest checkpoint; the best one is kept besides it
    assert [p.name for p in ckpt.checkpoints(run)] == ["step-2", "step-6"]
    assert resolve_model_path(f"{run}:best") == str(run / "checkpoints" / "step-2")
    assert resolve_model_path(str(run)) == str(run / "checkpoints" / "step-6")
    assert ckpt.load_state(run / "checkpoints" / "step-6")["best"]["step"] == 2

    # a kill between a checkpoint and best.json leaves best.json stale: the resumed trainer's record wins
    stale = {**best, "step": 6, "checkpoint": "checkpoints/step-6", "value": 0.25}
    ckpt.write_best(run, stale)
    resumed, path = resume_run(run, [], allow_changes=False)
    assert path.name == "step-6" and resumed.best["step"] == 2
    assert ckpt.best_record(run) == best

    # the report shows held-out next to reward and says which checkpoint it judges, and which one is the best
    from grpolab.report.build import ReportOptions, build_report
    from grpolab.report.evidence import judged_checkpoint

    build_report(run, ReportOptions(skip_safety=True, skip_diversity=True))
    md = (run / "report.md").read_text()
    assert "Checkpoint judged: the weights at step 6, the last periodic held-out eval of training" in md
    assert (
        "The run's best checkpoint by held-out accuracy is step-2, 0.750 [0.650, 0.850] on 2 problems: highest "
        "held-out accuracy"
    ) in md and "evaluate RUN:best" in md
    assert 'alt="Held-out accuracy (periodic eval) vs training reward"' in (run / "report.html").read_text()
    row = {"model": f"{run}:best", "path": str(run / "checkpoints" / "step-2")}  # an eval file's row of RUN:best
    judged = judged_checkpoint(run, row, None)
    assert judged["judged"] == "step-2" and judged["is_best"] and judged["best"]["step"] == 2


def test_a_later_tie_does_not_move_the_best_and_a_better_one_does(tiny_model_dir, tmp_path, monkeypatch):
    trainer, _ = start_run(from_dict(config(tiny_model_dir, tmp_path, "tie", steps=6)))
    plant_heldout(monkeypatch, trainer, {2: 0.5, 4: 0.5, 6: 0.625})
    seen = []
    trainer.fit(lambda step, m: seen.append((step, (ckpt.best_record(trainer.run_dir) or {}).get("step"))))
    assert seen == [(1, None), (2, None), (3, 2), (4, 2), (5, 2), (6, 2)]  # best.json follows the step's save
    assert ckpt.best_record(tmp_path / "tie")["step"] == 6
    assert [p.name for p in ckpt.checkpoints(tmp_path / "tie")] == ["step-6"]  # step-2 no longer protected


def test_run_best_names_what_is_missing(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    with pytest.raises(GrpolabError, match=r"not a run directory"):
        resolve_model_path(f"{run}:best")
    (run / "manifest.json").write_text("{}")
    with pytest.raises(GrpolabError, match=r"no best checkpoint .*eval.every_steps > 0"):
        resolve_model_path(f"{run}:best")
    (run / "checkpoints" / "best.json").write_text(json.dumps({"step": 4}))
    with pytest.raises(GrpolabError, match=r"names step 4, but .*step-4 is not a complete checkpoint"):
        resolve_model_path(f"{run}:best")
    with pytest.raises(GrpolabError, match=r"no complete checkpoint step-3"):
        ckpt.write_best(run, {"step": 3})


def test_report_of_run_best_runs_its_own_models_on_the_best_checkpoint(tmp_path):
    """`grpolab report RUN:best`: capability, safety and diversity load the best checkpoint, not the newest."""
    from grpolab.report.build import ReportOptions, judged_weights, split_best
    from grpolab.report.evidence import RunEvidence

    run = tmp_path / "run"
    for step in (2, 4):
        (run / "checkpoints" / f"step-{step}").mkdir(parents=True)
        (run / "checkpoints" / f"step-{step}" / ckpt.STATE_FILE).write_bytes(b"")
    ev = RunEvidence(run_dir=run, manifest={}, metrics=[], samples=[])
    assert judged_weights(ev, ReportOptions()).name == "step-4"
    with pytest.raises(GrpolabError, match=r"run:best: the run has no best checkpoint"):
        judged_weights(ev, ReportOptions(best=True))
    ckpt.write_best(run, {"step": 2, "metric": "eval/accuracy", "value": 0.5})
    assert judged_weights(ev, ReportOptions(best=True)).name == "step-2"
    assert split_best([f"{run}:best"]) == ([run], True) and split_best([run, run]) == ([run, run], False)
    with pytest.raises(GrpolabError, match="name every run RUN:best or none"):
        split_best([f"{run}:best", run])
