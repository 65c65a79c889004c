"""The OpenAI-compatible endpoint (grpolab.agents.openai_server / openai_sessions / chat_tools): token-in /
token-out sessions, the model's tool-call format, OpenAI errors and session isolation.

The engine is scripted (tests/openai_scripted.py): every token it draws and its logprob are known, so the
recorded episode can be compared token for token with what the model saw and with the chat template's rendering.
"""

from __future__ import annotations

import json

import pytest
from openai_scripted import ScriptedEngine

from grpolab.agents.chat_tools import CHATML_TOOLS_TEMPLATE, ChatError, tool_format
from grpolab.agents.env import EpisodeLimits
from grpolab.agents.openai_server import Endpoint, EndpointSettings, Server
from grpolab.agents.openai_sessions import ApiError, check_messages, render_ids

MODEL = "policy"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an expression.",
            "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
        },
    }
]
LIMITS = EpisodeLimits(max_turns=6, max_turn_tokens=64, max_total_tokens=600, time_limit_s=5.0)


def call(name: str, **args) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def endpoint(tok, script, **settings) -> tuple[Endpoint, ScriptedEngine]:
    engine = ScriptedEngine(tok, script)
    return Endpoint(engine, tok, EndpointSettings(MODEL, **settings)), engine


def ask(ep: Endpoint, session, messages, **body) -> dict:
    return ep.complete(session, {"model": MODEL, "messages": messages, **body})


def play(ep: Endpoint, session, turns: list[list[dict]], tools=TOOLS) -> list[dict]:
    """Send the opening messages, then after each answer the answer as returned and the next new messages; the
    final transcript (every message, the last answer included)."""
    messages = list(turns[0])
    for new in turns[1:] + [None]:
        reply = ask(ep, session, messages, tools=tools, logprobs=True)
        messages.append(reply["choices"][0]["message"])
        if new is None:
            return messages
        messages += new


def recorded(session) -> list[int]:
    return session.episode.prompt + session.episode.tokens


def multi_turn_script(prompt, k):
    n = multi_turn_script.calls = getattr(multi_turn_script, "calls", 0) + 1
    return [
        call("calculator", expression="2+3") + "\n" + call("calculator", expression="4*5"),
        "",
        "The answer is 25.",
    ][(n - 1) % 3]


def test_sequence_is_the_templates_rendering_of_the_transcript_and_the_mask_the_models_tokens(tok):
    """Multi-turn with two tool calls in one turn, two consecutive tool messages, an empty answer and an empty user
    message: the recorded sequence equals apply_chat_template's of the final transcript (up to the template's text
    after the last end of turn); loss mask = exactly the sampled ids, logprobs aligned with them."""
    multi_turn_script.calls = 0
    ep, engine = endpoint(tok, multi_turn_script)
    s = ep.open(LIMITS)
    transcript = play(
        ep,
        s,
        [
            [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is (2+3)*(4*5)/4?"}],
            [
                {"role": "tool", "tool_call_id": "a", "content": "5"},
                {"role": "tool", "tool_call_id": "b", "content": "20"},
            ],
            [{"role": "user", "content": ""}],
        ],
    )
    assert [m.get("tool_calls") is not None for m in transcript if m["role"] == "assistant"] == [True, False, False]
    assert transcript[2]["content"] is None and transcript[5]["content"] == ""
    s.finish()
    full = render_ids(tok, ep.template, check_messages(transcript), TOOLS, generation=False)
    seq = recorded(s)
    assert seq == full[: len(seq)] and tok.decode(full[len(seq) :]) == "\n"
    # the loss mask covers the sampled ids, in order, and nothing else; logprobs sit on those ids
    e = s.episode
    model = [t for t, m in zip(e.tokens, e.loss) if m]
    drawn = [c for entry in s.log for c in entry["choices"][0]]
    assert model == drawn and sum(e.loss) == len(drawn) == e.result.model_tokens
    assert [lp for lp, m in zip(e.logp, e.loss) if m] == pytest.approx(
        [-(c + 1) / 100 - i / 1000 for c, entry in enumerate(s.log) for i in range(len(entry["choices"][0]))]
    )
    assert all(lp == 0.0 for lp, m in zip(e.logp, e.loss) if not m)
    assert [lp for lp, m in zip(e.logp, e.loss) if m] == [p for entry in s.log for p in entry["logprobs"][0]]
    # each request was prompted with the previous prompt + the sampled ids + the new messages' rendering
    for before, after in zip(s.log, s.log[1:]):
        assert after["prompt_ids"][: len(before["prompt_ids"]) + len(before["choices"][0])] == (
            before["prompt_ids"] + before["choices"][0]
        )
    assert e.result.turns == 3 and e.result.tool_calls == 2 and e.result.ended_by == "done"


def test_sampled_ids_are_kept_not_re_encoded(tok):
    """The model's ids are a non-canonical tokenization of its text (one id per character): the episode and the
    next prompt hold those ids, never the text encoded again."""
    chars = [tok.convert_tokens_to_ids(c) for c in "Hello"] + [tok.convert_tokens_to_ids("<|im_end|>")]
    assert chars != tok("Hello", add_special_tokens=False)["input_ids"] + [chars[-1]]
    ep, engine = endpoint(tok, lambda p, k: list(chars))
    s = ep.open(LIMITS)
    play(ep, s, [[{"role": "user", "content": "hi"}], [{"role": "user", "content": "again"}]])
    n = len(s.log[0]["prompt_ids"])
    assert engine.prompts[1][n : n + len(chars)] == chars
    assert s.episode.tokens[: len(chars)] == chars


THINK_TEMPLATE = (
    "{%- for message in messages %}{%- set content = message.content or '' %}"
    "{%- if message.role == 'assistant' and not loop.last and '</think>' in content %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}{%- endif %}"
    "{{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def test_a_template_that_strips_earlier_thinking_records_what_the_model_saw(tok):
    """The template renders an earlier turn without its <think> block; the episode keeps the block the model
    produced and read (documented choice), so it differs from the final transcript's rendering exactly there."""
    tok2 = type(tok).from_pretrained(tok.name_or_path)
    tok2.chat_template = THINK_TEMPLATE.replace("{%- for", "{%- if tools %}{%- endif %}{%- for", 1)
    answers = iter(["<think>\nadd them\n</think>\n5", "<think>\nok\n</think>\ndone"])
    ep, engine = endpoint(tok2, lambda p, k: next(answers), tool_format="hermes")
    s = ep.open(LIMITS)
    transcript = play(ep, s, [[{"role": "user", "content": "2+3?"}], [{"role": "user", "content": "Sure?"}]])
    s.finish()
    assert engine.prompts[1][: len(engine.prompts[0])] == engine.prompts[0]
    assert "add them" in tok.decode(engine.prompts[1]) and "add them" in tok.decode(recorded(s))
    rendered = tok2.apply_chat_template(check_messages(transcript), tokenize=False)
    assert "add them" not in rendered  # the template drops it: the recorded sequence is not its rendering
    assert tok.decode(recorded(s)).replace("<think>\nadd them\n</think>\n", "") + "\n" == rendered


def test_n_choices_and_the_one_continued(tok):
    """n=2: the episode continues with the choice the next request repeats (its ids), not the first."""
    ep, engine = endpoint(tok, lambda p, k: f"option {k}" if len(engine.prompts) <= 2 else "end")
    s = ep.open(LIMITS)
    first = ask(ep, s, [{"role": "user", "content": "pick"}], n=2)
    assert [c["message"]["content"] for c in first["choices"]] == ["option 0", "option 1"]
    second_ids = s.pending[1].ids
    ask(ep, s, [{"role": "user", "content": "pick"}, first["choices"][1]["message"], {"role": "user", "content": "go"}])
    assert s.episode.tokens[: len(second_ids)] == second_ids


def test_malformed_call_comes_back_as_content(tok):
    ep, _ = endpoint(tok, lambda p, k: '<tool_call>\n{"name": calculator}\n</tool_call>')
    s = ep.open(LIMITS)
    r = ask(ep, s, [{"role": "user", "content": "x"}], tools=TOOLS)
    choice = r["choices"][0]
    assert choice["finish_reason"] == "stop" and "tool_calls" not in choice["message"]
    assert choice["message"]["content"].startswith("<tool_call>")
    s.finish()
    assert s.episode.result.tool_errors == 1


def test_logprobs_align_with_tokens(tok):
    ep, _ = endpoint(tok, lambda p, k: "Two words")
    s = ep.open(LIMITS)
    r = ask(ep, s, [{"role": "user", "content": "x"}], logprobs=True)
    content = r["choices"][0]["logprobs"]["content"]
    ids = s.pending[0].ids
    assert [c["token"] for c in content] == [tok.decode([i]) for i in ids]
    assert [c["logprob"] for c in content] == pytest.approx(s.pending[0].logp)
    assert r["usage"]["completion_tokens"] == len(ids)


def test_bounds_end_the_episode(tok):
    ep, _ = endpoint(tok, lambda p, k: "word " * 40)
    s = ep.open(EpisodeLimits(max_turns=2, max_turn_tokens=8, max_total_tokens=100))
    r = ask(ep, s, [{"role": "user", "content": "x"}])
    assert r["choices"][0]["finish_reason"] == "length" and len(s.pending[0].ids) == 8
    with pytest.raises(ApiError) as err:
        ask(ep, s, [{"role": "user", "content": "x"}, r["choices"][0]["message"], {"role": "user", "content": "y"}])
    assert err.value.code == "episode_ended" and s.ended == "max_turn_tokens"
    ep2, _ = endpoint(tok, lambda p, k: "ok")
    s2 = ep2.open(EpisodeLimits(max_turns=1, max_turn_tokens=8, max_total_tokens=100))
    r = ask(ep2, s2, [{"role": "user", "content": "x"}])
    with pytest.raises(ApiError):
        ask(ep2, s2, [{"role": "user", "content": "x"}, r["choices"][0]["message"], {"role": "user", "content": "y"}])
    assert s2.ended == "max_turns" and s2.episode.result.turns == 1


def test_hermes_parser_and_template_round_trip():
    parse = tool_format("auto", CHATML_TOOLS_TEMPLATE)
    p = parse("Let me add.\n" + call("calculator", expression="1+1") + "\n" + call("calculator", expression="2"))
    assert p.content == "Let me add." and [c["name"] for c in p.calls] == ["calculator", "calculator"]
    assert json.loads(p.calls[0]["arguments"]) == {"expression": "1+1"} and p.error is None
    assert parse(call("f") + " trailing").error and parse("<tool_call>\n{").calls == []
    with pytest.raises(ChatError):
        tool_format("auto", "{{ messages }}")
    with pytest.raises(ChatError):
        tool_format("mistral", CHATML_TOOLS_TEMPLATE)


# ------------------------------------------------------------------------------------------------ over HTTP


@pytest.fixture()
def served(tok):
    ep, engine = endpoint(tok, lambda p, k: "fine")
    server = Server(ep).start()
    yield server
    server.stop()


def client_of(server, session, **kw):
    from openai import OpenAI

    return OpenAI(base_url=server.base_url, api_key=server.api_key(session), max_retries=0, timeout=30, **kw)


def test_openai_errors_leave_the_run_intact(served):
    import openai

    s = served.endpoint.open(EpisodeLimits(max_turns=4, max_turn_tokens=16, max_total_tokens=200))
    c = client_of(served, s)
    assert [m.id for m in c.models.list().data] == [MODEL]
    msgs = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.NotFoundError) as e:
        c.chat.completions.create(model="gpt-4o", messages=msgs)
    assert e.value.code == "model_not_found" and e.value.body["param"] == "model" and "type" in e.value.body
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "word " * 2000}])
    assert e.value.code == "context_length_exceeded"
    bad_tools = [{"type": "function", "function": {"name": "has space"}}]
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model=MODEL, messages=msgs, tools=bad_tools)
    assert e.value.body["param"] == "tools[0].function.name"
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model=MODEL, messages=msgs, temperature=0.3)
    assert e.value.body["param"] == "temperature"
    assert s.episode.prompt == [] and s.episode.tokens == []  # nothing recorded by refused requests
    r = c.chat.completions.create(model=MODEL, messages=msgs, logprobs=True)
    assert r.choices[0].message.content == "fine" and len(r.choices[0].logprobs.content) == r.usage.completion_tokens
    with pytest.raises(openai.BadRequestError) as e:  # an edited history: refused, the episode unchanged
        c.chat.completions.create(
            model=MODEL,
            messages=[
                {"role": "user", "content": "other"},
                {"role": "assistant", "content": "fine"},
                {"role": "user", "content": "x"},
            ],
        )
    assert e.value.code == "session_diverged" and s.episode.tokens == [] and len(s.pending) == 1
    r2 = c.chat.completions.create(
        model=MODEL,
        messages=msgs + [r.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "more"}],
    )
    assert r2.choices[0].message.content == "fine" and sum(s.episode.loss) == r.usage.completion_tokens


def test_keys_reach_only_their_own_session(served, tok):
    import openai

    a = served.endpoint.open(LIMITS)
    b = served.endpoint.open(LIMITS)
    client_of(served, a).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "a"}])
    assert a.log and not b.log  # a's request recorded in a only
    other, _ = endpoint(tok, lambda p, k: "x")
    other_server = Server(other).start()
    try:
        with pytest.raises(openai.AuthenticationError):  # a key of this run on another run's endpoint
            client_of(other_server, a).models.list()
    finally:
        other_server.stop()
    from openai import OpenAI

    wrong = OpenAI(base_url=served.base_url, api_key="sess-guess", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as e:
        wrong.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "b"}])
    assert e.value.code == "invalid_api_key" and not b.log
    served.endpoint.sessions.close(a.key)  # an ended episode's key opens nothing any more
    with pytest.raises(openai.AuthenticationError):
        client_of(served, a).models.list()


def test_another_address_needs_a_token(tok):
    ep, _ = endpoint(tok, lambda p, k: "x")
    with pytest.raises(ChatError, match="needs a token"):
        Server(ep, host="0.0.0.0")
    server = Server(ep, host="127.0.0.1", token="t0ken").start()  # a token on loopback: the key carries it
    try:
        import openai
        from openai import OpenAI

        s = ep.open(LIMITS)
        assert server.api_key(s) == f"t0ken.{s.key}"
        assert client_of(server, s).models.list().data[0].id == MODEL
        with pytest.raises(openai.AuthenticationError):
            OpenAI(base_url=server.base_url, api_key=s.key, max_retries=0).models.list()
    finally:
        server.stop()


def test_an_engine_failure_fails_that_request_only_and_a_retry_goes_on(tok):
    """The engine raises on the second turn: that request fails; the same request again samples from the same
    state, and the episode holds each sampled turn once."""
    state = {"n": 0}

    def flaky(prompt, k):
        state["n"] += 1
        if state["n"] == 2:
            raise RuntimeError("engine down")
        return f"turn {state['n']}"

    ep, engine = endpoint(tok, flaky)
    s = ep.open(LIMITS)
    first = ask(ep, s, [{"role": "user", "content": "a"}])
    again = [{"role": "user", "content": "a"}, first["choices"][0]["message"], {"role": "user", "content": "b"}]
    with pytest.raises(RuntimeError, match="engine down"):
        ask(ep, s, again)
    second = ask(ep, s, again)
    assert second["choices"][0]["message"]["content"] == "turn 3"
    assert engine.prompts[1] == engine.prompts[2]  # the retry saw exactly what the failed request did
    s.finish()
    assert s.episode.result.turns == 2 and s.episode.tokens.count(ep.stop_ids[0]) == 2 + 1  # 2 turns, 1 delta end


def test_concurrent_requests_share_one_engine_call_each_cut_to_its_own_budget(tok):
    import threading

    ep, engine = endpoint(tok, lambda p, k: "one two three four five six seven", batch_window_s=1.0)
    sessions = [ep.open(LIMITS) for _ in range(3)]
    replies = [None] * 3

    def go(i: int, max_tokens: int) -> None:
        replies[i] = ask(ep, sessions[i], [{"role": "user", "content": f"q{i}"}], max_tokens=max_tokens)

    threads = [threading.Thread(target=go, args=(i, m)) for i, m in enumerate([3, 5, 64])]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert engine.calls == 1 and len(engine.prompts) == 3
    assert [len(s.pending[0].ids) for s in sessions][:2] == [3, 5]
    assert [r["choices"][0]["finish_reason"] for r in replies] == ["length", "length", "stop"]
    assert [s.pending[0].bound for s in sessions] == [None, None, None]  # the agent's own max_tokens: no bound
