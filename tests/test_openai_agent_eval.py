"""Held-out evaluation of openai_agent runs (grpolab.evaluation.episodes.episode_runner): the agent program,
unmodified, plays one greedy episode per held-out initial state against an endpoint of the evaluation's own, judged
by the environment; success, horizon slices and failure reasons as for the native agent tasks, in the evaluation
JSON the report reads -- through `grpolab eval`'s path (run_eval) and the periodic eval of a run."""

from __future__ import annotations

import json
from pathlib import Path

import earnable
import pytest
from openai_scripted import ScriptedEngine

import grpolab.agents  # noqa: F401 -- registers the built-in environments
from grpolab.agents.env import EpisodeLimits
from grpolab.agents.openai_agent import OpenAIAgentTask
from grpolab.agents.openai_server import Endpoint, EndpointSettings
from grpolab.agents.openai_sessions import ApiError
from grpolab.evaluation.heldout import add_paired, evaluate_model, model_row
from grpolab.evaluation.overlap import problem_hash
from grpolab.evaluation.result import EvalSettings

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = f"{ROOT / 'examples' / 'openai_calc_agent.py'}:solve"


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


class RecordingEngine(ScriptedEngine):
    """A ScriptedEngine that keeps the sampling parameters of every call."""

    def __init__(self, tokenizer, script):
        super().__init__(tokenizer, script)
        self.params: list = []

    def generate(self, prompts, params, seeds=None):
        self.params.append(params)
        return super().generate(prompts, params, seeds)


def policy(tok, problems, plan):
    """A script answering each held-out question by `plan[i]` (i: the problem's index): ``right`` (the gold answer),
    ``tool`` (a calculator call, then the gold answer), ``malformed`` (a broken call) or ``wrong``."""

    def script(prompt, k):
        text = tok.decode(prompt)
        i = next(j for j, p in enumerate(problems) if p.question in text)
        gold, how = problems[i].answer, plan[i]
        if how == "tool" and "<tool_response>" not in text:
            args = {"expression": problems[i].data["expression"]}
            return "<tool_call>\n" + json.dumps({"name": "calculator", "arguments": args}) + "\n</tool_call>"
        if how == "malformed":
            return '<tool_call>\n{"name": calculator}\n</tool_call>'
        return f"The answer is {gold}" if how in ("right", "tool") else f"The answer is {int(gold) + 1}"

    return script


def test_base_and_trained_on_held_out_episodes_match_a_hand_count(tok):
    """Two models (scripted) on 4 held-out episodes of the unmodified example agent: success, tool calls, failure
    reasons and the paired difference equal a count made from the recorded episodes; every request greedy; the
    training reward (``reported``: this agent reports none) does not judge held-out episodes, the environment does."""
    task = OpenAIAgentTask(
        "calc", agent=EXAMPLE, reward="reported", num_train=40, num_test=4, max_turns=3, max_total_tokens=600
    )
    train, held_out = task.problems("train"), task.problems("test")
    assert not {problem_hash(p) for p in held_out} & {problem_hash(p) for p in train}
    plans = {"base": ["wrong", "wrong", "wrong", "right"], "trained": ["right", "tool", "malformed", "wrong"]}
    rows, engines = [], {}
    for name, plan in plans.items():
        engines[name] = engine = RecordingEngine(tok, policy(tok, held_out, plan))
        result = evaluate_model(engine, tok, held_out, EvalSettings(batch_size=4, task="openai_agent", model=name))
        rows.append(model_row(name, name, result, {}, "greedy"))
    add_paired(rows)
    base, trained = rows
    # the hand count, from each recorded episode (its tokens decoded) and the gold answers
    for row in rows:
        wins = [it["completion"].endswith(f"The answer is {it['gold']}<|im_end|>") for it in row["items"]]
        calls = [it["completion"].count("<tool_call>") for it in row["items"]]
        assert [it["correct"] for it in row["items"]] == wins
        assert row["accuracy"] == sum(wins) / 4 and row["metrics"]["tool_calls"]["mean"] == sum(calls) / 4
        assert not any(it["scores"]["invalid"] for it in row["items"])  # judged by the env, not by `reported`
    assert (base["accuracy"], trained["accuracy"]) == (0.25, 0.5)
    assert trained["paired_vs_first"]["accuracy"]["mean"] == pytest.approx((1 + 1 + 0 - 1) / 4)
    assert [it["scores"]["turns"] for it in trained["items"]] == [1, 2, 1, 1]
    assert [it["failure"] for it in trained["items"]] == [
        None,
        None,
        {"reason": "malformed_call", "turn": 1},
        {"reason": "wrong_answer", "turn": 1},
    ]
    assert (
        trained["metrics"]["failed_malformed_call"]["mean"] == 0.25
        and trained["metrics"]["tool_errors"]["mean"] == 0.25
    )
    assert trained["metrics"]["failed_malformed_call@turn1"] == {"mean": 0.25}
    assert "calls=0" in trained["per_slice"]  # the horizon slice of calc difficulty 1
    assert all(p.greedy for e in engines.values() for p in e.params)  # the endpoint served greedily


def test_an_evaluation_endpoint_is_greedy_whatever_temperature_the_agent_names(tok):
    """temperature 0.7 and n = 3: accepted, decoded greedily once, three copies of that answer; a training endpoint
    refuses a temperature other than the run's."""
    engine = RecordingEngine(tok, lambda p, k: "fine")
    ep = Endpoint(engine, tok, EndpointSettings("m", temperature=1.0, greedy=True))
    session = ep.open(EpisodeLimits(max_turns=2, max_turn_tokens=16, max_total_tokens=200))
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 0.7, "n": 3}
    reply = ep.complete(session, body)
    assert [c["message"]["content"] for c in reply["choices"]] == ["fine"] * 3
    assert len(engine.params) == 1 and engine.params[0].greedy and engine.params[0].group_size == 1
    training = Endpoint(engine, tok, EndpointSettings("m", temperature=1.0))
    with pytest.raises(ApiError, match="temperature"):
        training.complete(training.open(EpisodeLimits()), body)
    for e in (ep, training):
        e.close()


WRAPPER = """
import json
import sys

sys.path.insert(0, {examples!r})
from openai_calc_agent import solve as example


def solve(question, base_url, api_key, model):  # the example agent, its sessions logged
    with open({log!r}, "a") as f:
        f.write(json.dumps({{"question": question, "key": api_key, "base_url": base_url}}) + "\\n")
    return example(question, base_url=base_url, api_key=api_key, model=model)
"""


def test_a_run_is_evaluated_periodically_and_by_grpolab_eval_on_new_held_out_sessions(
    tiny_model_dir, tmp_path, one_thread
):
    """eval.every_steps on an openai_agent run, then base vs the run by run_eval (what `grpolab eval` calls): held-out
    sessions are new sessions on held-out questions only, the result is the evaluation JSON the report reads."""
    from grpolab.config import from_dict as build
    from grpolab.evaluation.heldout import run_eval
    from grpolab.report.evidence import heldout_comparison, load_run
    from grpolab.runs import start_run

    log = tmp_path / "sessions.jsonl"
    (tmp_path / "agent.py").write_text(WRAPPER.format(examples=str(ROOT / "examples"), log=str(log)))
    options = {
        "env": "calc",
        "agent": f"{tmp_path / 'agent.py'}:solve",
        "num_train": 8,
        "num_test": 3,
        "max_turns": 2,
        "max_turn_tokens": earnable.LENGTH,
        "max_total_tokens": 64,
        "agent_time_limit_s": 60.0,
    }
    cfg = {
        "model": {"name": tiny_model_dir},
        "task": {"name": "openai_agent", "options": options},
        "reward": {"weights": {"env": 1.0}},
        "rollout": {"group_size": 2, "top_k": 2, "dtype": "float32"},
        "algorithm": {"beta": 0.0},
        "train": {"steps": 1, "prompts_per_step": 2, "micro_batch_size": 4, "precision": "fp32", "save_every": 1},
        "eval": {"every_steps": 1, "num_problems": 3, "batch_size": 8},
        "run": {"output_dir": str(tmp_path), "name": "oa"},
    }
    trainer, _ = start_run(build(cfg))
    try:
        trainer.fit()
        training_url = trainer.collector.runner.server.base_url
    finally:
        trainer.close()
    run_dir = tmp_path / "oa"
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert metrics[-1]["eval/n"] == 3 and 0.0 <= metrics[-1]["eval/accuracy"] <= 1.0
    test_uids = {p.uid for p in OpenAIAgentTask(**{**options, "agent": EXAMPLE}).problems("test")}
    assert set(json.loads((run_dir / "eval_items.jsonl").read_text())["correct"]) == test_uids

    result = run_eval([tiny_model_dir, str(run_dir)], "openai_agent", options, "test", 0, 64, 8, "float32")
    assert result["task"] == "openai_agent" and result["n"] == 3
    assert result["models"][1]["held_out"]["checked"] and result["models"][1]["held_out"]["overlap"] == 0
    for row in result["models"]:
        assert row["accuracy"] == sum(it["correct"] for it in row["items"]) / 3
        assert {it["uid"] for it in row["items"]} == test_uids
    sessions = [json.loads(line) for line in log.read_text().splitlines()]
    trained_on = [s for s in sessions if s["base_url"] == training_url]
    held = [s for s in sessions if s["base_url"] != training_url]
    assert len(trained_on) == 4 and len(held) == 3 * 3  # 2 x 2 training episodes; 3 evaluations of 3 episodes
    assert not {s["question"] for s in trained_on} & {s["question"] for s in held}
    assert not {s["key"] for s in trained_on} & {s["key"] for s in held}
    assert len({s["key"] for s in held}) == len(held)  # every held-out episode a session of its own

    (run_dir / "eval").mkdir(exist_ok=True)
    (run_dir / "eval" / "base_vs_trained.json").write_text(json.dumps(result))
    cmp = heldout_comparison(load_run(run_dir))
    assert cmp["task"] == "openai_agent" and cmp["source"] == "eval/base_vs_trained.json" and cmp["n"] == 3
    assert cmp["trained"]["accuracy"] == result["models"][1]["accuracy"]
