"""Tools in the model's own chat format, for the OpenAI-compatible endpoint (grpolab.agents.openai_sessions):
checking OpenAI ``tools`` schemas, the registry of tool-call formats (how a model writes a call in its template),
and grpolab's ChatML template with tools for models whose template has none (the bundled SmolLM2).

- ``TOOL_FORMATS``: one entry per format, keyed by name; ``hermes`` is the Hermes / Qwen form, a call per
  ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` block after optional content;
  ``llama3_json`` is Llama 3.1 / 3.2 / 3.3's JSON form, the whole turn ``{"name": ..., "parameters": {...}}``
  (several joined by ``;`` or in a JSON list, an optional ``<|python_tag|>`` first). A format parses a model's
  output into (content, tool calls, error) -- a malformed call is returned as content with the reason, never
  raised. ``tool_format("auto", template)`` reads the format from the chat template (``FORMAT_SIGNS``).
- ``CHATML_TOOLS_TEMPLATE``: ChatML (``<|im_start|>role\\n...<|im_end|>\\n``) with the tools listed in the system
  message and calls and results in the Hermes form -- Qwen2.5's layout, so a model trained on it meets the
  common open format. ``chat_template`` picks the template of a session: the tokenizer's own when it renders
  ``tools``, else this one for ChatML tokenizers (a ChatError otherwise).

These are pure functions of text and JSON; the tokenizer is only read (its template string).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Callable

TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")

CHATML_TOOLS_TEMPLATE = (
    "{%- set default_system = 'You are a helpful AI assistant named SmolLM, trained by Hugging Face' %}"
    "{%- if tools %}{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content }}{%- else %}{{- default_system }}{%- endif %}"
    "{{- '\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": '
    "<args-json-object>}\\n</tool_call><|im_end|>\\n' }}"
    "{%- elif messages[0].role != 'system' %}{{- '<|im_start|>system\\n' + default_system + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'system' and loop.first and tools %}"
    "{%- elif message.role == 'assistant' and message.tool_calls %}{{- '<|im_start|>assistant' }}"
    "{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}"
    "{%- for tool_call in message.tool_calls %}"
    "{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}"
    '{{- \'\\n<tool_call>\\n{"name": "\' + tool_call.name + \'", "arguments": \' }}'
    "{%- if tool_call.arguments is string %}{{- tool_call.arguments }}{%- else %}"
    "{{- tool_call.arguments | tojson }}{%- endif %}{{- '}\\n</tool_call>' }}"
    "{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + (message.content or '') + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}{{- '<|im_start|>' + message.role + '\\n' + (message.content or '') + '<|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


class ChatError(ValueError):
    """A request the chat format cannot take (bad tool schema, a template without tools): an OpenAI-style 400."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.param, self.code = param, code


@dataclass(frozen=True)
class Parsed:
    """A model turn as the API returns it: content (None when the turn is only calls), tool calls as
    ``{"name", "arguments": JSON text}``, and why a call was malformed (then it stays in content)."""

    content: str | None
    calls: list[dict]
    error: str | None = None


def check_tools(tools: Any) -> list[dict]:
    """The request's ``tools`` as a list of OpenAI function tools; ChatError naming the bad field otherwise.

    >>> check_tools([{"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}])[0]["function"]["name"]
    'calc'
    """
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise ChatError("tools: expected a list of tool objects", "tools")
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
            raise ChatError(f"{where}: expected {{'type': 'function', 'function': {{...}}}}", where)
        fn = tool["function"]
        if not isinstance(fn.get("name"), str) or not TOOL_NAME.match(fn["name"]):
            raise ChatError(
                f"{where}.function.name: expected 1-64 letters, digits, '_' or '-'", f"{where}.function.name"
            )
        if "description" in fn and not isinstance(fn["description"], str):
            raise ChatError(f"{where}.function.description: expected a string", f"{where}.function.description")
        params = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, dict) or params.get("type", "object") != "object":
            raise ChatError(
                f"{where}.function.parameters: expected a JSON schema of type object", f"{where}.function.parameters"
            )
    return tools


def _hermes_parse(text: str) -> Parsed:
    """Hermes / Qwen calls: content, then ``<tool_call>\\n{json}\\n</tool_call>`` blocks (one newline before each).

    >>> _hermes_parse('Sure.\\n<tool_call>\\n{"name": "f", "arguments": {"x": 1}}\\n</tool_call>').calls
    [{'name': 'f', 'arguments': '{"x": 1}'}]
    >>> _hermes_parse('<tool_call>\\n{"name": f}\\n</tool_call>').error[:16]
    'tool call 1: not'
    """
    start = text.find("<tool_call>")
    if start < 0:
        return Parsed(text, [])
    calls, rest = [], text[start:]
    for k, block in enumerate(re.findall(r"<tool_call>(.*?)</tool_call>", rest, re.DOTALL), 1):
        try:
            call = json.loads(block)
        except json.JSONDecodeError as exc:
            return Parsed(text, [], f"tool call {k}: not JSON ({exc.msg})")
        if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not call["name"]:
            return Parsed(text, [], f'tool call {k}: expected {{"name": ..., "arguments": {{...}}}}')
        args = call.get("arguments", {})
        if not isinstance(args, dict):
            return Parsed(text, [], f"tool call {k}: arguments must be a JSON object")
        calls.append({"name": call["name"], "arguments": json.dumps(args, ensure_ascii=False)})
    leftover = re.sub(r"<tool_call>.*?</tool_call>", "", rest, flags=re.DOTALL)
    if not calls or leftover.strip():
        return Parsed(text, [], "an unclosed <tool_call> or text after the calls")
    content = text[:start]
    content = content[:-1] if content.endswith("\n") else content
    return Parsed(content or None, calls)


PYTHON_TAG = "<|python_tag|>"


def _json_values(text: str) -> list:
    """The JSON values of `text` one after another, each optionally followed by ``;`` (ValueError otherwise).

    >>> _json_values('{"a": 1}; {"b": 2}')
    [{'a': 1}, {'b': 2}]
    """
    decoder, values, i = json.JSONDecoder(), [], 0
    while i < len(text):
        try:
            value, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError as exc:
            raise ValueError(f"text after the calls (character {i})" if values else f"not JSON ({exc.msg})") from None
        values.append(value)
        i = len(text) - len(text[i:].lstrip().removeprefix(";").lstrip())
    return values


def _llama3_parse(text: str) -> Parsed:
    """Llama 3.1 / 3.2 / 3.3 JSON calls: the whole turn is ``{"name": ..., "parameters": {...}}`` (``arguments``
    accepted too), several joined by ``;`` or in a JSON list, after an optional ``<|python_tag|>``. A turn that does
    not open with ``{`` or ``[`` and name a ``"name"`` is plain content (no call was tried).

    >>> _llama3_parse('{"name": "f", "parameters": {"x": 1}}').calls
    [{'name': 'f', 'arguments': '{"x": 1}'}]
    >>> _llama3_parse('The answer is 5.').content, _llama3_parse('{"name": "f", "parameters": 3}').error
    ('The answer is 5.', 'tool call 1: parameters must be a JSON object')
    """
    body = text.strip().removeprefix(PYTHON_TAG).strip()
    if not body.startswith(("{", "[")) or '"name"' not in body:
        return Parsed(text, [])
    try:
        values = _json_values(body)
    except ValueError as exc:
        return Parsed(text, [], f"tool calls: {exc}")
    objects = [v for value in values for v in (value if isinstance(value, list) else [value])]
    calls = []
    for k, call in enumerate(objects, 1):
        if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not call["name"]:
            return Parsed(text, [], f'tool call {k}: expected {{"name": ..., "parameters": {{...}}}}')
        args = call.get("parameters", call.get("arguments", {}))
        if not isinstance(args, dict):
            return Parsed(text, [], f"tool call {k}: parameters must be a JSON object")
        calls.append({"name": call["name"], "arguments": json.dumps(args, ensure_ascii=False)})
    return Parsed(None, calls) if calls else Parsed(text, [], "tool calls: an empty list")


TOOL_FORMATS: dict[str, Callable[[str], Parsed]] = {  # the format of tool calls, by name
    "hermes": _hermes_parse,
    "llama3_json": _llama3_parse,
}
# how `auto` recognises a format in a chat template: every string of the entry occurs in it (first match wins)
FORMAT_SIGNS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("hermes", ("<tool_call>",)),
    ("llama3_json", ("<|start_header_id|>", '"parameters"')),
)


def tool_format(name: str, template: str) -> Callable[[str], Parsed]:
    """The parser of format `name`; ``auto`` reads it from the chat template (FORMAT_SIGNS: ``<tool_call>`` is
    hermes, Llama 3's header tokens with ``"parameters"`` llama3_json)."""
    if name == "auto":
        found = [f for f, signs in FORMAT_SIGNS if all(sign in template for sign in signs)]
        if not found:
            raise ChatError(
                "tool_format auto: the chat template shows no known tool-call form; name one of "
                + ", ".join(sorted(TOOL_FORMATS))
            )
        name = found[0]
    if name not in TOOL_FORMATS:
        raise ChatError(f"tool_format: expected auto or one of {', '.join(sorted(TOOL_FORMATS))}, got {name!r}")
    return TOOL_FORMATS[name]


def chat_template(tokenizer) -> str:
    """The template sessions render with: the tokenizer's when it renders tools, grpolab's ChatML template with
    tools when the tokenizer's is ChatML without them; ChatError otherwise."""
    own = getattr(tokenizer, "chat_template", None) or ""
    if "tools" in own:
        return own
    if "<|im_start|>" in own:
        return CHATML_TOOLS_TEMPLATE
    raise ChatError(
        "the model's chat template renders no tools and is not ChatML: give the tokenizer a template "
        "with tools (tokenizer.chat_template)"
    )


def template_messages(messages: list[dict]) -> list[dict]:
    """OpenAI messages as chat templates take them: a tool call's ``arguments`` JSON text as an object (what
    transformers' templates expect), content None kept None."""
    out = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls"):
            m["tool_calls"] = [
                {
                    "type": "function",
                    "function": {
                        "name": c["function"]["name"],
                        "arguments": json.loads(c["function"]["arguments"] or "{}"),
                    },
                }
                for c in m["tool_calls"]
            ]
        out.append(m)
    return out
