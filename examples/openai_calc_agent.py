"""An agent written against the `openai` package alone: it answers an arithmetic word problem with a calculator
tool it runs itself. Nothing in it knows grpolab; grpolab trains the model behind it (docs/agents.md "Agents through
the OpenAI API"):

    task: {name: openai_agent, options: {env: calc, agent: examples/openai_calc_agent.py:solve}}
    task: {name: openai_agent, options: {env: calc, command: "python examples/openai_calc_agent.py"}}

As a command it reads OPENAI_BASE_URL and OPENAI_API_KEY (the openai client does), OPENAI_MODEL and the question
from GRPOLAB_QUESTION, and prints its answer.
"""

from __future__ import annotations

import ast
import json
import operator
import os

from openai import OpenAI

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression (+ - * / and parentheses).",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string", "description": "e.g. 12 * (3 + 4)"}},
                "required": ["expression"],
            },
        },
    }
]
OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def calculator(expression: str) -> str:
    """The value of an arithmetic expression, or an error message (never eval)."""

    def value(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in OPS:
            return OPS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        raise ValueError("only numbers, + - * / and parentheses")

    try:
        return str(value(ast.parse(str(expression), mode="eval").body))
    except (SyntaxError, ValueError, ZeroDivisionError) as exc:
        return f"Error: {exc}"


def solve(
    question: str,
    base_url: str | None = None,
    api_key: str | None = None,
    model: str | None = None,
    max_rounds: int = 4,
) -> str:
    """Ask the model, run the calculator calls it makes, and return its final answer."""
    client = OpenAI(base_url=base_url, api_key=api_key)
    model = model or client.models.list().data[0].id
    messages = [{"role": "user", "content": question}]
    for _ in range(max_rounds):
        reply = client.chat.completions.create(model=model, messages=messages, tools=TOOLS, max_tokens=64)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return message.content or ""
        for call in message.tool_calls:
            args = json.loads(call.function.arguments or "{}")
            messages.append(
                {"role": "tool", "tool_call_id": call.id, "content": calculator(args.get("expression", ""))}
            )
    return ""


if __name__ == "__main__":
    print(solve(os.environ["GRPOLAB_QUESTION"], model=os.environ.get("OPENAI_MODEL")))
