"""Tool-call formats other than Hermes (grpolab.agents.chat_tools.TOOL_FORMATS): Llama 3.1 / 3.2 / 3.3's JSON calls,
parsed from hand-written outputs (well-formed, several calls, malformed: returned as content, never raised), found
in a chat template by ``tool_format: auto`` or named by the user, and rendered through ``apply_chat_template(...,
tools=...)`` of a Llama-3.1-style template built here (no network) -- then a whole endpoint session in that format."""

from __future__ import annotations

import json
import random

import pytest
from openai_scripted import ScriptedEngine

from grpolab.agents.chat_tools import (
    CHATML_TOOLS_TEMPLATE,
    TOOL_FORMATS,
    ChatError,
    chat_template,
    template_messages,
    tool_format,
)
from grpolab.agents.env import EpisodeLimits
from grpolab.agents.openai_server import Endpoint, EndpointSettings
from grpolab.agents.openai_sessions import ApiError

llama = TOOL_FORMATS["llama3_json"]

# The tool parts of Llama 3.1's template: tools listed in the first user message with the JSON instruction, a call
# rendered as {"name": ..., "parameters": ...}, one call per message, results in the ipython role.
LLAMA31_TEMPLATE = (
    "{{- bos_token }}{%- if not tools is defined %}{%- set tools = none %}{%- endif %}"
    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}"
    "{%- if tools is not none %}{{- 'Environment: ipython\\n' }}{%- endif %}"
    "{{- 'Cutting Knowledge Date: December 2023\\nToday Date: 26 Jul 2024\\n\\n<|eot_id|>' }}"
    "{%- if tools is not none %}{%- set first = messages[0]['content']|trim %}{%- set messages = messages[1:] %}"
    "{{- '<|start_header_id|>user<|end_header_id|>\\n\\nGiven the following functions, please respond with a JSON "
    "for a function call with its proper arguments that best answers the given prompt.\\n\\nRespond in the format "
    '{"name": function name, "parameters": dictionary of argument name and its value}. Do not use variables.\\n\\n\' }}'
    "{%- for t in tools %}{{- t | tojson(indent=4) }}{{- '\\n\\n' }}{%- endfor %}"
    "{{- first + '<|eot_id|>' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + (message['content'] or '') | trim "
    "+ '<|eot_id|>' }}"
    "{%- elif 'tool_calls' in message %}"
    "{%- if not message.tool_calls|length == 1 %}"
    "{{- raise_exception('This model only supports single tool-calls at once!') }}{%- endif %}"
    "{%- set tool_call = message.tool_calls[0].function %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    '{{- \'{"name": "\' + tool_call.name + \'", "parameters": \' }}{{- tool_call.arguments | tojson }}'
    "{{- '}<|eot_id|>' }}"
    "{%- else %}{{- '<|start_header_id|>ipython<|end_header_id|>\\n\\n' + message.content + '<|eot_id|>' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)
SPECIAL = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|python_tag|>"]
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


def llama_call(name: str, **params) -> str:
    return json.dumps({"name": name, "parameters": params})


@pytest.mark.parametrize(
    "text, calls",
    [
        (llama_call("calculator", expression="2+3"), [("calculator", {"expression": "2+3"})]),
        ("<|python_tag|>" + llama_call("f", x=1), [("f", {"x": 1})]),  # the tag kept by a decode with specials
        ("  " + llama_call("f") + "\n", [("f", {})]),
        ('{"name": "f", "arguments": {"y": [1, 2]}}', [("f", {"y": [1, 2]})]),  # arguments, the OpenAI spelling
        (llama_call("f", x=1) + "; " + llama_call("g", y="z"), [("f", {"x": 1}), ("g", {"y": "z"})]),
        (f"[{llama_call('f', x=1)}, {llama_call('g')}]", [("f", {"x": 1}), ("g", {})]),
        ('{"name": "f", "parameters": {"s": "caf\\u00e9"}}', [("f", {"s": "café"})]),
    ],
)
def test_llama3_well_formed_calls(text, calls):
    parsed = llama(text)
    assert parsed.content is None and parsed.error is None
    assert [(c["name"], json.loads(c["arguments"])) for c in parsed.calls] == calls


@pytest.mark.parametrize(
    "text, error",
    [
        ('{"name": "f", "parameters": {"x": 1}', "not JSON"),  # unclosed
        (llama_call("f") + " and then some", "text after the calls"),
        (llama_call("f") + "; " + '{"name": "g", "parameters": ', "text after the calls"),
        ('{"name": 7, "parameters": {}}', 'expected {"name"'),
        ('{"name": "f", "parameters": [1]}', "parameters must be a JSON object"),
        ('[{"name": "f"}, 3]', "tool call 2"),
        ('{"name": ""}', 'expected {"name"'),
    ],
)
def test_llama3_malformed_calls_come_back_as_content(text, error):
    parsed = llama(text)
    assert parsed.calls == [] and parsed.content == text and error in parsed.error


@pytest.mark.parametrize("text", ["The answer is 5.", "", '{"answer": 5}', "[1, 2, 3]", "Call {f} now"])
def test_llama3_plain_answers_are_content_without_error(text):
    assert llama(text).content == text and llama(text).calls == [] and llama(text).error is None


def test_llama3_parser_never_raises():
    """Every prefix of a two-call output, and random splices of JSON punctuation: content or calls, never a raise."""
    whole = llama_call("f", x=[1, {"a": "b"}]) + "; " + llama_call("g", y="z")
    rng = random.Random(0)
    pieces = ['{"name"', ":", '"f"', ",", '"parameters"', "{", "}", "[", "]", ";", '"', "\\", " ", "x", "1e999"]
    texts = [whole[:i] for i in range(len(whole) + 1)]
    texts += ["".join(rng.choice(pieces) for _ in range(rng.randint(1, 12))) for _ in range(300)]
    for text in texts:
        parsed = llama(text)
        assert (parsed.calls and parsed.content is None) or (not parsed.calls and parsed.content == text)
    assert len(llama(whole).calls) == 2


def test_the_format_is_read_from_the_template_or_named_by_the_user():
    assert tool_format("auto", LLAMA31_TEMPLATE) is llama
    assert tool_format("auto", CHATML_TOOLS_TEMPLATE) is TOOL_FORMATS["hermes"]
    assert tool_format("llama3_json", CHATML_TOOLS_TEMPLATE) is llama  # the user's choice wins over the template
    with pytest.raises(ChatError, match="hermes, llama3_json"):
        tool_format("mistral", LLAMA31_TEMPLATE)
    with pytest.raises(ChatError, match="no known tool-call form"):
        tool_format("auto", "{{ messages }}")


@pytest.fixture(scope="module")
def llama_tok(tiny_model_dir):
    """The test tokenizer with Llama 3's special tokens and the template above (built here, offline)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.add_special_tokens({"additional_special_tokens": SPECIAL})
    tok.bos_token, tok.chat_template = "<|begin_of_text|>", LLAMA31_TEMPLATE
    return tok


def test_llama3_calls_render_through_apply_chat_template_and_parse_back(llama_tok):
    """tools= puts the schemas in the first user message; a call rendered by the template parses back to itself."""
    assert chat_template(llama_tok) == LLAMA31_TEMPLATE  # the model's own template: it renders tools
    call = {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "2+3"}}}
    messages = [{"role": "user", "content": "What is 2+3?"}, {"role": "assistant", "tool_calls": [call]}]
    text = llama_tok.apply_chat_template(messages, tools=TOOLS, tokenize=False)
    assert '"name": "calculator"' in text and "Given the following functions" in text  # the schema, as JSON
    turn = text.rsplit("<|start_header_id|>assistant<|end_header_id|>\n\n", 1)[1].removesuffix("<|eot_id|>")
    assert turn == llama_call("calculator", expression="2+3")
    assert [(c["name"], json.loads(c["arguments"])) for c in llama(turn).calls] == [
        ("calculator", {"expression": "2+3"})
    ]


def test_an_endpoint_session_in_the_llama3_format(llama_tok):
    """A call parsed into tool_calls, its result in the ipython role, the answer: the episode is the template's
    rendering of the final transcript, the loss mask exactly the sampled turns; two calls in one turn, which this
    template refuses to render later, give an OpenAI 400 that changes nothing."""
    tok, eot = llama_tok, llama_tok.convert_tokens_to_ids("<|eot_id|>")
    turns = iter([llama_call("calculator", expression="2+3"), "The answer is 5."])
    engine = ScriptedEngine(tok, lambda p, k: next(turns))
    engine.stop_ids = [eot]
    ep = Endpoint(engine, tok, EndpointSettings("m"), [eot])
    session = ep.open(EpisodeLimits(max_turns=4, max_turn_tokens=64, max_total_tokens=1200))
    messages = [{"role": "user", "content": "What is 2+3?"}]
    reply = ep.complete(session, {"model": "m", "messages": messages, "tools": TOOLS})
    choice = reply["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    assert json.loads(choice["message"]["tool_calls"][0]["function"]["arguments"]) == {"expression": "2+3"}
    call_id = choice["message"]["tool_calls"][0]["id"]
    messages += [choice["message"], {"role": "tool", "tool_call_id": call_id, "content": "5"}]
    reply = ep.complete(session, {"model": "m", "messages": messages, "tools": TOOLS})
    messages.append(reply["choices"][0]["message"])
    session.finish()
    episode = session.episode
    rendered = tok.apply_chat_template(template_messages(messages), tools=TOOLS, tokenize=False)
    assert tok.decode(episode.prompt + episode.tokens) == rendered
    sampled = [t for t, m in zip(episode.tokens, episode.loss) if m]
    assert tok.decode(sampled) == llama_call("calculator", expression="2+3") + "<|eot_id|>The answer is 5.<|eot_id|>"
    assert episode.result.tool_calls == 1 and episode.result.tool_errors == 0

    two = iter([llama_call("calculator", expression="1") + "; " + llama_call("calculator", expression="2"), "ok"])
    ep2 = Endpoint(ScriptedEngine(tok, lambda p, k: next(two)), tok, EndpointSettings("m"), [eot])
    s2 = ep2.open(EpisodeLimits(max_turns=4, max_turn_tokens=64, max_total_tokens=1200))
    history = [{"role": "user", "content": "go"}]
    answer = ep2.complete(s2, {"model": "m", "messages": history, "tools": TOOLS})["choices"][0]["message"]
    assert len(answer["tool_calls"]) == 2
    results = [{"role": "tool", "tool_call_id": c["id"], "content": "1"} for c in answer["tool_calls"]]
    history += [answer, *results]
    ep2.complete(s2, {"model": "m", "messages": history, "tools": TOOLS})  # the two-call turn is the last: renders
    second = s2.pending[0].message
    before = (list(s2.episode.tokens), s2.episode.result.turns)
    with pytest.raises(ApiError, match="single tool-calls") as err:
        ep2.complete(
            s2, {"model": "m", "messages": history + [second, {"role": "user", "content": "and?"}], "tools": TOOLS}
        )
    assert err.value.status == 400 and err.value.code == "template_error"
    assert (list(s2.episode.tokens), s2.episode.result.turns) == before and s2.pending  # nothing changed
    for e in (ep, ep2):
        e.close()
