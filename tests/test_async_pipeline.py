"""Asynchronous rollouts with a staleness bound (rollout.max_staleness; grpolab/training/pipeline.py, docs/async.md),
on grpolab's own decode loop in a worker process (rollout.engine: grpolab_process) and a tiny random model that earns
tests/earnable.py's reward."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import earnable
import pytest
import torch
from safetensors.torch import load_file

from grpolab.config import from_dict
from grpolab.errors import ConfigError, GrpolabError
from grpolab.models import checkpoint as ckpt
from grpolab.rollout.workers.process import EngineDied
from grpolab.runs import resume_run, start_run
from grpolab.training.pipeline import RolloutPipeline

pytestmark = pytest.mark.usefixtures("one_thread")
VOLATILE = ("time/", "throughput/", "memory/", "async/wait_s", "sync/")


def tiny(model_dir: str, out: Path, name: str, k: int, engine: str = "grpolab_process", **train) -> dict:
    return {
        "model": {"name": model_dir},
        "task": {"name": "arithmetic", "options": {"num_train": 50, "num_test": 20}},
        "reward": earnable.reward_config(),
        "rollout": earnable.rollout_config(group_size=4, engine=engine, max_staleness=k, worker_threads=1),
        "algorithm": {"preset": "grpo", "beta": 0.0, "entropy_coef": 0.0, "is_mode": "token_truncate"},
        "train": {
            "steps": 4,
            "prompts_per_step": 2,
            "micro_batch_size": 8,
            "lr": 5e-3,
            "seed": 0,
            "samples_per_step": 8,
            "save_every": 1,
            **train,
        },
        "eval": {"every_steps": 0},
        "run": {"output_dir": str(out), "name": name},
    }


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def stable(row: dict) -> dict:
    return {k: v for k, v in row.items() if not k.startswith(VOLATILE)}


def weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(ckpt.latest_checkpoint(run) / "model.safetensors")


def assert_same_bytes(a: Path, b: Path) -> None:
    ra, rb = rows(a / "metrics.jsonl"), rows(b / "metrics.jsonl")
    assert [r["step"] for r in ra] == [r["step"] for r in rb]
    for x, y in zip(ra, rb):
        assert stable(x) == stable(y), f"step {x['step']} differs"
    assert rows(a / "samples.jsonl") == rows(b / "samples.jsonl")
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys() and all(torch.equal(wa[n], wb[n]) for n in wa)


def train(raw: dict, counts: dict | None = None, on_step=None) -> Path:
    trainer, _ = start_run(from_dict(raw))
    try:
        if counts is not None:
            count_queue(trainer.pipeline, counts)
        trainer.fit(on_step)
    finally:
        trainer.close()
    return Path(raw["run"]["output_dir"]) / raw["run"]["name"]


def count_queue(pipeline: RolloutPipeline, counts: dict) -> None:
    """Record every step the pipeline submits and every step it hands to the update."""
    draw, take = pipeline.collector.draw_round, pipeline.take

    def draw_round(step):
        counts.setdefault("submitted", []).append(step)
        return draw(step)

    def counted_take(step, version):
        batch, drawn = take(step, version)
        counts.setdefault("taken", []).append((step, drawn, len(batch.rollout)))
        return batch, drawn

    pipeline.collector.draw_round, pipeline.take = draw_round, counted_take


@pytest.fixture(scope="module")
def k1_run(tiny_model_dir, tmp_path_factory) -> tuple[dict, Path, dict]:
    out = tmp_path_factory.mktemp("k1")
    raw, counts = tiny(tiny_model_dir, out, "k1", 1), {}
    return raw, train(raw, counts), counts


def test_k0_on_the_worker_process_is_the_in_process_loop_to_the_byte(tiny_model_dir, tmp_path):
    """max_staleness 0 is today's synchronous loop; its rollouts drawn by grpolab's decode loop in a worker process
    are the same bytes as in this process (same seeds, weights and one thread each)."""
    here = train(tiny(tiny_model_dir, tmp_path, "here", 0, engine="grpolab", steps=3))
    there = train(tiny(tiny_model_dir, tmp_path, "there", 0, steps=3))
    assert_same_bytes(here, there)
    assert all("policy_version" not in r for r in rows(there / "samples.jsonl"))


def test_k1_trains_each_step_on_the_weights_one_update_old_and_uses_every_sample_once(k1_run):
    raw, run, counts = k1_run
    steps, per_step = raw["train"]["steps"], raw["train"]["prompts_per_step"] * raw["rollout"]["group_size"]
    assert counts["submitted"] == list(range(steps)), "each step submitted once, in order"
    assert counts["taken"] == [(s, max(0, s - 1), per_step) for s in range(steps)], "each taken once, k=1 lag"
    metrics = rows(run / "metrics.jsonl")
    assert [m["async/staleness"] for m in metrics] == [0.0, 1.0, 1.0, 1.0]
    assert [m["async/policy_version"] for m in metrics] == [0.0, 0.0, 1.0, 2.0]
    assert all(m["loss/signal_token_frac"] > 0 and m["reward/std"] > 0 for m in metrics), "the reward was earned"
    stale = [m for m in metrics if m["async/staleness"] == 1.0]
    assert all(m["sampler/logp_diff_mean"] > 1e-4 for m in stale), "stale samples differ from the trained policy"
    versions = {(r["step"], r["policy_version"]) for r in rows(run / "samples.jsonl")}
    assert versions == {(1, 0), (2, 0), (3, 1), (4, 2)}
    card = json.loads((run / "manifest.json").read_text())["objective"]
    staleness = card["choices"]["staleness"]
    assert staleness["max_staleness"] == 1 and "fixed lag" in staleness["schedule"]


def test_k1_differs_from_k0_and_two_k1_runs_are_the_same_bytes(k1_run, tiny_model_dir, tmp_path):
    raw, run, _ = k1_run
    again = train({**raw, "run": {"output_dir": str(tmp_path), "name": "again"}})
    assert_same_bytes(run, again)
    sync = train(tiny(tiny_model_dir, tmp_path, "sync", 0))
    first, later = rows(sync / "samples.jsonl"), rows(run / "samples.jsonl")

    def completions(samples, step):
        return [(r["uid"], r["completion"]) for r in samples if r["step"] == step]

    assert completions(first, 1) == completions(later, 1), "step 1: the initial weights either way"
    assert [r["uid"] for r in first] == [r["uid"] for r in later], "the same prompts, in the same order"
    assert completions(first, 2) != completions(later, 2), "step 2: k=0 samples after update 1, k=1 before it"


class Crash(Exception):
    pass


@pytest.mark.parametrize("k", [1, 2])
def test_a_crash_then_resume_gives_the_uninterrupted_runs_bytes(k, k1_run, tiny_model_dir, tmp_path):
    """The checkpoint of step 2 holds the rollouts already generated for steps 3..2+k; a run that dies in step 3 and
    resumes from it trains on them and ends with the uninterrupted run's samples and weights."""
    whole = k1_run[1] if k == 1 else train(tiny(tiny_model_dir, tmp_path, "whole", k))
    raw = tiny(tiny_model_dir, tmp_path, "crashed", k)

    def die_in_step_3(step, metrics):
        if step == 3:  # after step 3 is logged, before its checkpoint
            raise Crash

    with pytest.raises(Crash):
        train(raw, on_step=die_in_step_3)
    run = tmp_path / "crashed"
    state = ckpt.load_state(ckpt.latest_checkpoint(run))
    assert state["step"] == 2 and [q["step"] for q in state["pipeline"]["queue"]] == list(range(2, 2 + k))
    resumed, path = resume_run(run, [], allow_changes=False)
    try:
        assert path.name == "step-2"
        resumed.fit()
    finally:
        resumed.close()
    assert_same_bytes(whole, run)


def test_scalerl_with_the_largest_asynchrony_filters_zero_variance_groups(tiny_model_dir, tmp_path):
    """ScaleRL's preset (CISPO, prompt-level mean, batch std, zero-variance groups dropped without refilling) with a
    PipelineRL-style lag: each step trains on its own first round's groups with signal, sampled on weights up to
    max_staleness updates old."""
    raw = tiny(tiny_model_dir, tmp_path, "scalerl", 2, steps=3)
    raw["algorithm"] = {"preset": "scalerl", "is_mode": "token_truncate"}
    metrics = rows(train(raw) / "metrics.jsonl")
    assert [m["async/staleness"] for m in metrics] == [0.0, 1.0, 2.0], "k = steps - 1: every batch from version 0"
    assert [m["async/policy_version"] for m in metrics] == [0.0, 0.0, 0.0]
    for m in metrics:
        assert m["dynamic/extra_rounds"] == 0.0
        kept_share = m["dynamic/kept_groups"] / raw["train"]["prompts_per_step"]
        assert kept_share == pytest.approx(1 - m["groups/frac_zero_std"]), "exactly the groups with signal are kept"


def test_a_dead_or_silent_worker_is_a_clear_error_within_its_bound(tiny_model_dir, tmp_path):
    for how, expected in ((signal.SIGKILL, r"exited with code"), (signal.SIGSTOP, r"gave no answer .* within 3 s")):
        raw = tiny(tiny_model_dir, tmp_path, f"fault-{how.name}", 1)
        raw["rollout"]["worker_call_timeout_s"] = 3.0
        trainer, _ = start_run(from_dict(raw))

        def stop_worker(step, metrics, pid=trainer.engine.pid, how=how):
            if step == 1:
                os.kill(pid, how)

        try:
            with pytest.raises(EngineDied, match=expected):
                trainer.fit(stop_worker)
        finally:
            trainer.close()
        run = tmp_path / f"fault-{how.name}"
        logged = [r["step"] for r in rows(run / "metrics.jsonl")]
        assert logged in ([1], [1, 2]), "step 2 only if its rollout had arrived before the worker stopped"
        assert all(r["reward/invalid_frac"] == 0 for r in rows(run / "metrics.jsonl")), "no step on a broken batch"


def test_the_settings_the_pipeline_cannot_honour_are_refused(tiny_model_dir, tmp_path):
    def config(**changes):
        raw = tiny(tiny_model_dir, tmp_path, "refused", 1)
        for dotted, value in changes.items():
            section, name = dotted.split("__")
            raw[section][name] = value
        return from_dict(raw)

    with pytest.raises(
        ConfigError, match=r"rollout.engine: expected grpolab_process, vllm or vllm_server .* got grpolab"
    ):
        config(rollout__engine="grpolab")
    with pytest.raises(ConfigError, match=r"algorithm.max_extra_rounds: expected 0 with dynamic sampling"):
        config(algorithm__dynamic_sampling=True, algorithm__max_extra_rounds=2)
    assert config(algorithm__dynamic_sampling=True).algorithm.max_extra_rounds == 0  # filtering, no refill: kept
    with pytest.raises(ConfigError, match=r"algorithm.is_mode: expected an importance weight"):
        config(algorithm__is_mode="none")
    with pytest.raises(ConfigError, match=r"algorithm.is_mode: expected an importance weight"):
        config(algorithm__is_mode="none", algorithm__offpolicy_mask_delta=0.5)  # a mask drops, it does not weight
    with pytest.raises(ConfigError, match=r"rollout.max_staleness: expected an integer >= 0"):
        config(rollout__max_staleness=-1)
    steps = config().train.steps
    with pytest.raises(ConfigError, match=rf"rollout.max_staleness: expected < train.steps \({steps}\)"):
        config(rollout__max_staleness=steps)
    assert config(rollout__max_staleness=steps - 1).rollout.max_staleness == steps - 1


def test_a_checkpoint_of_another_staleness_is_refused_on_resume(k1_run, tmp_path):
    raw, run, _ = k1_run
    with pytest.raises(GrpolabError, match=r"max_staleness"):
        resume_run(run, ["rollout.max_staleness=2"], allow_changes=True)


def test_the_release_report_shows_staleness_and_warns_when_most_samples_were_at_the_bound(k1_run):
    from grpolab.gate.base import NA, PASS, WARN
    from grpolab.gate.thresholds import Thresholds
    from grpolab.gate.training import check_staleness, training_checks

    t = Thresholds()
    raw, run, _ = k1_run
    history = rows(run / "metrics.jsonl")
    config = json.loads((run / "manifest.json").read_text())["config"]
    found = next(c for c in training_checks(history, config, None, t) if c.name == "staleness")
    assert found.status == WARN and found.numbers["at_bound_frac"] == 0.75 and found.numbers["max_staleness"] == 1
    assert "75% of the samples were 1 update(s) old" in found.reason and "k3 KL" in found.reason
    two = {"rollout": {"max_staleness": 2}}
    fresh = [{"async/staleness": a, "sampler/kl_k3": 0.01} for a in (0, 1, 2, 1)]  # one of four at the bound
    assert check_staleness(fresh, two, t).status == PASS
    assert check_staleness(fresh[:3] + [{"async/staleness": 2}], two, t).status == PASS  # exactly 0.5: not above
    assert check_staleness(fresh + [{"async/staleness": 2}] * 3, two, t).status == WARN  # 4 of 7 at the bound
    assert check_staleness(history, {"rollout": {"max_staleness": 0}}, t).status == NA
    assert check_staleness(history, None, t).status == NA


def test_the_worker_scores_with_the_weights_synced_to_it(tiny_model_dir):
    """grpolab's worker process (rollout.engine: grpolab_process): its teacher-forced logprobs equal the policy's
    here (fp32, one thread each), before and after an update synced to it; an update not yet synced is not seen."""
    from grpolab.algo.logprobs import token_logprobs
    from grpolab.models.load import load_causal_lm, load_tokenizer
    from grpolab.rollout.worker_engine import GrpolabProcessEngine

    tok, policy = load_tokenizer(tiny_model_dir), load_causal_lm(tiny_model_dir, "float32").eval()
    seq = tok.encode("What is 2 + 3? The answer is 5.")

    def here() -> torch.Tensor:
        with torch.no_grad():
            logits = policy(torch.tensor([seq])).logits[:, :-1].float()
        return token_logprobs(logits, torch.tensor([seq[1:]]), 1.0)[0]

    engine = GrpolabProcessEngine(policy, tok, torch.float32, threads=1)
    try:
        before = here()
        assert torch.allclose(engine.score([seq])[0], before, atol=1e-5)
        with torch.no_grad():
            for p in policy.parameters():
                p.add_(0.05 * torch.randn_like(p))
        after = here()
        assert (after - before).abs().max() > 1e-2, "the update moved the logprobs"
        assert torch.allclose(engine.score([seq])[0], before, atol=1e-5), "not synced: the old weights"
        engine.sync_weights(policy)
        assert torch.allclose(engine.score([seq])[0], after, atol=1e-5)
        assert engine.last_sync["bytes"] > 0 and engine.in_flight == 0
    finally:
        engine.close()
