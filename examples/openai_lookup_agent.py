"""An agent written against the `openai` package alone: it finds a four-digit code by opening boxes, one `open` call
per box, each box holding the code or a note naming the next box. The boxes are the `lookup` environment's world
(`grpolab.agents.lookup.open_box` is their directory, as a web API would be for another agent); the agent itself is
plain client code, and grpolab trains the model behind it (docs/agents.md "Agents through the OpenAI API"):

    task: {name: openai_agent, options: {env: lookup, agent: examples/openai_lookup_agent.py:solve}}
    task: {name: openai_agent, options: {env: lookup, command: "python examples/openai_lookup_agent.py"}}

As a command it reads OPENAI_BASE_URL and OPENAI_API_KEY (the openai client does), OPENAI_MODEL and the question
from GRPOLAB_QUESTION, and prints its answer.
"""

from __future__ import annotations

import json
import os

from openai import OpenAI

from grpolab.agents.lookup import open_box
from grpolab.agents.tools import ToolError

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "open",
            "description": "Show what is inside the box with this label: a code, or a note naming another box.",
            "parameters": {
                "type": "object",
                "properties": {"label": {"type": "string", "description": "a box label, e.g. amber-412"}},
                "required": ["label"],
            },
        },
    }
]


def open_tool(label: str) -> str:
    """The box's content, or the error message for a label that names no box."""
    try:
        return open_box(str(label))
    except ToolError as exc:
        return f"Error: {exc}"


def solve(
    question: str,
    base_url: str | None = None,
    api_key: str | None = None,
    model: str | None = None,
    max_rounds: int = 5,
) -> str:
    """Ask the model, open the boxes it names, and return its final answer."""
    client = OpenAI(base_url=base_url, api_key=api_key)
    model = model or client.models.list().data[0].id
    messages = [{"role": "user", "content": question}]
    for _ in range(max_rounds):
        reply = client.chat.completions.create(model=model, messages=messages, tools=TOOLS, max_tokens=48)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return message.content or ""
        for call in message.tool_calls:
            try:
                label = json.loads(call.function.arguments or "{}").get("label", "")
            except (json.JSONDecodeError, AttributeError):
                label = ""
            messages.append({"role": "tool", "tool_call_id": call.id, "content": open_tool(label)})
    return ""


if __name__ == "__main__":
    print(solve(os.environ["GRPOLAB_QUESTION"], model=os.environ.get("OPENAI_MODEL")))
