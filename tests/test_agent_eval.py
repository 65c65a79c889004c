"""Credit assignment evaluated on its own: success per horizon slice (calls=1, 2, 3+) with intervals, and where each
failed episode went wrong (reason and turn) -- hand-built episodes with planted failures, then a whole evaluation."""

from __future__ import annotations

import math

import pytest

import grpolab.agents  # noqa: F401 -- registers the built-in environments
from grpolab.agents.env import AgentTask
from grpolab.agents.episode import EpisodeResult
from grpolab.evaluation.episodes import FAILURES, episode_item, evaluate_episodes, failure_of, failures_by_turn
from grpolab.evaluation.result import EvalSettings, summarise


def result(reward=0.0, ended_by="done", turns=1, trace=()) -> EpisodeResult:
    return EpisodeResult(
        reward=reward,
        ended_by=ended_by,
        turns=turns,
        trace=[{"turn": t, "kind": k, "observation": o} for t, k, o in trace],
    )


CALL = (1, "call", "open result: The code is 4821.")


@pytest.mark.parametrize(
    "episode, expected",
    [
        (result(1.0, turns=2, trace=[CALL]), None),
        (result(math.nan, "invalid", turns=2), ("invalid", 2)),
        (
            result(0.0, turns=3, trace=[(1, "call", "x"), (2, "malformed_call", "Error: ..."), (3, "action", "")]),
            ("malformed_call", 2),
        ),
        (
            result(0.0, "max_turns", 4, [(1, "tool_error", "Error: no box"), (2, "malformed_call", "Error")]),
            ("malformed_call", 2),
        ),  # a malformed call outranks a refused one, whatever the turn
        (result(0.0, "max_turns", 4, [(1, "call", "x"), (3, "tool_error", "Error: no box")]), ("tool_error", 3)),
        (result(0.0, "max_turn_tokens", 3, [CALL]), ("bound_hit", 3)),
        (result(0.0, "done", 2, [CALL, (2, "action", "")]), ("misused_tool_result", 2)),
        (
            result(0.0, "done", 2, [(1, "call", "open result: A note: open box red-482."), (2, "action", "")]),
            ("wrong_answer", 2),
        ),  # 482 is not 4821: the gold never came back from a tool
        (
            result(0.0, "done", 1, [(1, "action", "4821")]),
            ("wrong_answer", 1),
        ),  # the environment's reply is no tool result
    ],
)
def test_each_failure_is_classified_with_its_turn(episode, expected):
    assert failure_of(episode, "4821") == expected


def _problem(calls: int, i: int):
    from grpolab.tasks.base import Problem

    return Problem(
        uid=f"p{calls}/{i}", question="q", answer="4821", slice=f"hops={calls}", data={"expert_calls": calls}
    )


def test_success_and_failures_per_horizon_slice():
    # calls=1: 3 of 4 succeed; calls=2: 1 of 2; hops 3 and 4 fall in calls=3+: 0 of 2 (a bound, a misused result)
    plan = [
        (1, result(1.0)),
        (1, result(1.0)),
        (1, result(1.0)),
        (1, result(0.0, "max_turns", 2)),
        (2, result(1.0)),
        (2, result(0.0, "done", 3, [CALL])),
        (3, result(0.0, "max_turn_tokens", 1)),
        (4, result(0.0, "done", 5, [CALL])),
    ]
    items = [episode_item(_problem(c, i), r, "") for i, (c, r) in enumerate(plan)]
    for it in items:
        assert it["scores"]["accuracy"] + sum(it["scores"][f"failed_{f}"] for f in FAILURES) == 1.0
    res = summarise(items, 1.0)
    assert {s: (res.per_slice[s]["n"], res.per_slice[s]["accuracy"]) for s in ("calls=1", "calls=2", "calls=3+")} == {
        "calls=1": (4, 0.75),
        "calls=2": (2, 0.5),
        "calls=3+": (2, 0.0),
    }
    three = res.per_slice["calls=3+"]["metrics"]
    assert three["failed_bound_hit"]["mean"] == 0.5 and three["failed_misused_tool_result"]["mean"] == 0.5
    lo, hi = res.per_slice["calls=1"]["ci_low"], res.per_slice["calls=1"]["ci_high"]
    assert lo <= 0.75 <= hi and lo < hi
    assert failures_by_turn(items) == {
        "failed_bound_hit@turn1": {"mean": 1 / 8},
        "failed_bound_hit@turn2": {"mean": 1 / 8},
        "failed_misused_tool_result@turn3": {"mean": 1 / 8},
        "failed_misused_tool_result@turn5": {"mean": 1 / 8},
    }


def test_a_whole_evaluation_reports_horizon_slices_and_failures(tiny_model_dir):
    import torch

    from grpolab.models.load import load_causal_lm, load_tokenizer
    from grpolab.rollout.grpolab_engine import GrpolabEngine

    model, tok = load_causal_lm(tiny_model_dir, "float32"), load_tokenizer(tiny_model_dir)
    task = AgentTask(
        "lookup", num_train=3, num_test=6, difficulty=1, max_turns=3, max_turn_tokens=6, max_total_tokens=120
    )
    res = evaluate_episodes(
        GrpolabEngine(model, tok, torch.float32), tok, task.problems("test"), EvalSettings(batch_size=6)
    )
    assert {"calls=1", "calls=2", "calls=3+", "hops=1", "hops=2", "hops=3"} <= set(res.per_slice)
    assert all(res.per_slice[s]["n"] == 2 for s in ("calls=1", "calls=2", "calls=3+"))
    # the random model never ends a turn by itself within 6 tokens: every episode fails on its first turn, a bound
    assert res.accuracy == 0.0 and res.metrics["failed_bound_hit"]["mean"] == 1.0
    assert res.metrics["failed_bound_hit@turn1"] == {"mean": 1.0}
    assert all(it["failure"] == {"reason": "bound_hit", "turn": 1} for it in res.items)
