"""Agent tasks without a model: tool-call parsing, the safe calculator, the killable tool worker, the environments'
disjoint splits, the agent task's option checks, Rollout.loss_mask through select / concat, episode metrics."""

from __future__ import annotations

import math
import time

import pytest
import torch

from grpolab.agents.calc import CalcEnv
from grpolab.agents.calc import make_problems as calc_problems
from grpolab.agents.episode import EpisodeResult
from grpolab.agents.guess import GuessEnv
from grpolab.agents.guess import make_problems as guess_problems
from grpolab.agents.tools import WORKER, Tool, ToolError, ToolFailure, calculate, parse_tool_call, register_tool
from grpolab.errors import ConfigError
from grpolab.rollout.base import Rollout, concat_rollouts
from grpolab.tasks import make_task
from grpolab.training.metrics import agent_metrics


def test_tool_calls_are_parsed_and_malformed_ones_say_why():
    assert parse_tool_call("x <tool> calculator( 2 * (3+4) ) </tool> y", {"calculator"}).argument == "2 * (3+4)"
    assert "without </tool>" in parse_tool_call("<tool>calculator(2", {"calculator"}).error
    assert "unknown tool 'search'" in parse_tool_call("<tool>search(x)</tool>", {"calculator"}).error
    assert parse_tool_call("no call here", {"calculator"}) is None


@pytest.mark.parametrize(
    "expr, out",
    [("23*17-5", "386"), ("7/2", "3.5"), ("-(3+4)*2", "-14"), ("2**10", "1024"), ("10 // 3", "3"), ("3 × 4", "12")],
)
def test_calculator_computes(expr, out):
    assert calculate(expr) == out


@pytest.mark.parametrize(
    "expr", ["__import__('os').system('x')", "a+1", "(1).real", "[1]*9", "9**9**9", "1/0", "lambda: 1", "2" * 300]
)
def test_calculator_refuses_anything_but_arithmetic(expr):
    with pytest.raises(ToolError):
        calculate(expr)


def _sleep_forever(argument: str) -> str:
    while True:
        time.sleep(0.05)


def _garbage(argument: str):
    return {"not": "text"}


def _boom(argument: str):
    raise RuntimeError("tool bug")


def test_a_hanging_tool_is_killed_within_its_limit_and_the_next_call_works():
    key = register_tool("test", Tool("hang", "hangs", _sleep_forever))
    ok = register_tool("test", Tool("calc", "calc", calculate))
    t0 = time.perf_counter()
    with pytest.raises(ToolFailure, match="time limit of 0.5 s"):
        WORKER.call(key, "x", 0.5)
    assert time.perf_counter() - t0 < 2.0
    assert WORKER.process is None  # killed, not abandoned
    assert WORKER.call(ok, "6*7", 5.0) == "42"  # a fresh worker


def test_tool_bugs_and_garbage_are_failures_and_model_mistakes_are_tool_errors():
    with pytest.raises(ToolFailure, match="RuntimeError: tool bug"):
        WORKER.call(register_tool("test", Tool("boom", "", _boom)), "", 5.0)
    with pytest.raises(ToolFailure, match="returned dict"):
        WORKER.call(register_tool("test", Tool("garbage", "", _garbage)), "", 5.0)
    with pytest.raises(ToolError, match="division by zero"):
        WORKER.call(register_tool("test", Tool("calc", "", calculate)), "1/0", 5.0)


@pytest.mark.parametrize("make", [calc_problems, guess_problems])
@pytest.mark.parametrize("difficulty", [1, 2])
def test_train_and_held_out_instances_are_disjoint_and_seeded(make, difficulty):
    train, test = make("train", 300, 0, difficulty), make("test", 100, 0, difficulty)
    assert not {p.question + p.answer for p in train} & {p.question + p.answer for p in test}
    assert not {p.uid for p in train} & {p.uid for p in test}
    assert [p.uid for p in make("test", 100, 0, difficulty)] == [p.uid for p in test]
    assert [p.uid for p in make("test", 100, 1, difficulty)] != [p.uid for p in test]


def test_calc_env_ends_on_the_answer_turn_and_scores_it_like_the_correct_reward():
    p = calc_problems("train", 1, 0, 2)[0]
    env = CalcEnv()
    assert p.question in env.reset(p, None) and env.requires_tools
    assert env.reward() == 0.0  # no answer turn yet (a bound ended the episode)
    assert env.step(f"so \\boxed{{{p.answer}}} or maybe 1") == ("", True) and env.reward() == 1.0  # the box wins
    env.reset(p, None)
    assert env.step(f"It is {p.answer}.") == ("", True) and env.reward() == 1.0  # no box: the last number
    env.reset(p, None)
    assert env.step(f"{p.answer} plus one is {int(p.answer) + 1}") == ("", True) and env.reward() == 0.0


def test_guess_env_answers_higher_lower_and_ends_on_the_secret():
    p = guess_problems("train", 1, 0, 1)[0]
    env, secret = GuessEnv(), int(p.answer)
    env.reset(p, None)
    assert env.step(f"{secret - 1}") == ("Higher.", False)
    assert env.step(f"maybe {secret + 1}") == ("Lower.", False)
    assert env.step("hmm") == ("Reply with one number.", False) and env.reward() == 0.0
    assert env.step(str(secret)) == ("Correct!", True) and env.reward() == 1.0


def test_agent_task_options_are_checked_and_carried_in_the_problems():
    with pytest.raises(ConfigError, match="task.options.env"):
        make_task("agent", env="nope")
    with pytest.raises(ConfigError, match="task.options.max_turns"):
        make_task("agent", env="calc", max_turns=0)
    p = make_task("agent", env="guess", num_train=3, max_turns=5).problems("train")[0]
    assert p.data["kind"] == "agent" and p.data["env"] == "guess" and p.data["limits"]["max_turns"] == 5


def test_a_user_environment_is_loaded_from_a_file(tmp_path):
    (tmp_path / "my_env.py").write_text(
        "from grpolab.agents.env import AgentEnv\nfrom grpolab.tasks.base import Problem\n"
        "class Echo(AgentEnv):\n"
        "    def reset(self, problem, rng): self.ok = False; return problem.question\n"
        "    def step(self, action): self.ok = 'yes' in action; return '', True\n"
        "    def reward(self): return float(self.ok)\n"
        "    @classmethod\n"
        "    def problems(cls, split, n, seed, difficulty):\n"
        "        return [Problem(uid=f'echo/{split}/{i}', question='say yes', answer='yes') for i in range(n)]\n"
    )
    task = make_task("agent", env=f"{tmp_path / 'my_env.py'}:Echo", num_test=3)
    assert [p.uid for p in task.problems("test")] == ["echo/test/0", "echo/test/1", "echo/test/2"]
    with pytest.raises(ConfigError, match="has no class 'Nope'"):
        make_task("agent", env=f"{tmp_path / 'my_env.py'}:Nope")
    (tmp_path / "half_env.py").write_text(  # a subclass that forgot reward(): refused at load, not mid-episode
        "from grpolab.agents.env import AgentEnv\n"
        "class Half(AgentEnv):\n"
        "    def reset(self, problem, rng): return problem.question\n"
        "    def step(self, action): return '', True\n"
        "    @classmethod\n"
        "    def problems(cls, split, n, seed, difficulty): return []\n"
    )
    with pytest.raises(ConfigError, match=r"task.options.env: .*half_env.py:Half lacks reward"):
        make_task("agent", env=f"{tmp_path / 'half_env.py'}:Half")


def _rollout(n: int, lc: int, loss: bool) -> Rollout:
    cm = torch.ones(n, lc, dtype=torch.long)
    return Rollout(
        torch.zeros(n, 2, dtype=torch.long),
        torch.ones(n, 2, dtype=torch.long),
        torch.arange(n * lc).view(n, lc),
        cm,
        torch.zeros(n, lc),
        torch.zeros(n, dtype=torch.bool),
        torch.arange(n),
        [""] * n,
        loss_mask=(cm * torch.tensor([1, 0] * (lc // 2) + [1] * (lc % 2))) if loss else None,
    )


def test_loss_mask_survives_select_and_concat_and_defaults_to_the_completion_mask():
    a, b = _rollout(2, 3, True), _rollout(2, 4, False)
    assert torch.equal(b.trained_mask(), b.completion_mask)
    assert torch.equal(a.select([1]).loss_mask, a.loss_mask[1:])
    c = concat_rollouts([a, b], 0)
    assert c.loss_mask.tolist() == [[1, 0, 1, 0], [1, 0, 1, 0], [1, 1, 1, 1], [1, 1, 1, 1]]
    assert concat_rollouts([b, b], 0).loss_mask is None


def test_agent_metrics_count_endings_tools_and_success_without_tools():
    rs = [
        EpisodeResult(1.0, "done", None, 2, 1, 0, 10, "", True),
        EpisodeResult(1.0, "done", None, 1, 0, 0, 4, "", True),
        EpisodeResult(0.0, "max_turns", None, 3, 3, 2, 30, "", True),
        EpisodeResult(math.nan, "invalid", "x", 1, 0, 0, 2, "", True),
    ]
    m = agent_metrics(rs)
    assert m["agent/success_frac"] == 0.5 and m["agent/turns_mean"] == 7 / 4 and m["agent/tool_errors_mean"] == 0.5
    assert m["agent/ended_by/done_frac"] == 0.5 and m["agent/ended_by/invalid_frac"] == 0.25
    assert m["agent/success_without_tool_frac"] == 0.5
    assert sum(v for k, v in m.items() if k.startswith("agent/ended_by/")) == 1.0


def _rows(success, turns, errors, bypass=None):
    return [
        {
            "step": i + 1,
            "agent/success_frac": s,
            "agent/turns_mean": u,
            "agent/tool_errors_mean": e,
            **({} if bypass is None else {"agent/success_without_tool_frac": bypass[i]}),
        }
        for i, (s, u, e) in enumerate(zip(success, turns, errors))
    ]


def test_report_agent_checks_flag_runaway_episodes_and_tool_bypass_and_are_na_elsewhere():
    from grpolab.gate.agent import agent_checks
    from grpolab.gate.thresholds import Thresholds

    agent, t = {"task": {"name": "agent"}}, Thresholds()
    calm = _rows([0.1] * 5 + [0.5] * 5, [1.5] * 10, [0.1] * 10, [0.0] * 10)
    assert [c.status for c in agent_checks(calm, agent, t)] == ["PASS", "PASS"]
    runaway = _rows([0.1] * 5 + [0.5] * 5, [1.0] * 5 + [2.5] * 5, [0.1] * 10, [0.1] * 5 + [0.8] * 5)
    assert [c.status for c in agent_checks(runaway, agent, t)] == ["WARN", "WARN"]  # training history: never FAIL
    errors = _rows([0.1] * 5 + [0.5] * 5, [1.0] * 10, [0.0] * 5 + [0.3] * 5)
    assert [c.status for c in agent_checks(errors, agent, t)] == ["WARN", "N/A"]
    assert agent_checks(runaway, {"task": {"name": "arithmetic"}}, t) == []  # not an agent run: no agent checks
    openai_agent = {"task": {"name": "openai_agent"}}  # episodes of an OpenAI-client agent: the same checks
    assert [c.status for c in agent_checks(runaway, openai_agent, t)] == ["WARN", "WARN"]


def test_the_documented_user_environment_runs_from_its_file():
    """examples/capitals.py is the code of docs/agents.md; loaded by path as a config would load it."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    doc = re.search(r"```python\n(.*?)```", (root / "docs" / "agents.md").read_text(), re.S).group(1)
    assert doc in (root / "examples" / "capitals.py").read_text()
    task = make_task("agent", env=f"{root / 'examples' / 'capitals.py'}:Capitals", max_turns=3)
    (p,) = task.problems("test")
    env = task.env_cls()
    assert "Rome" in env.reset(p, None) and env.requires_tools
    assert WORKER.call(register_tool("capitals", env.tools[0]), "rome", 5.0) == "Italy"
    assert env.step("Italy") == ("", True) and env.reward() == 1.0
