"""The README is a front door (issue 48): short, the quick tour within the first screens, every command it and
docs/results.md give resolves to a real `grpolab` command with real options (or a benchmark script with real
flags, a Makefile target), every repository path and link they name exists, and every headline interval of the
README is backed by the same figure on docs/results.md."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import typer

from grpolab.cli import app

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
RESULTS = ROOT / "docs" / "results.md"
MAX_README_WORDS = 1600
MAX_LINE_OF_QUICK_TOUR = 60


def code_block_lines(text: str) -> list[str]:
    """The lines of every fenced block that is not Python, continuation lines joined and trailing comments dropped."""
    lines = []
    for lang, body in re.findall(r"```(\w*)\n(.*?)```", text, re.S):
        if lang == "python":
            continue
        body = re.sub(r"\\\n\s*", " ", body)
        lines += [line.split("  #")[0].strip() for line in body.splitlines() if line.strip()]
    return lines


def inline_spans(text: str) -> list[str]:
    """Every single-backtick code span outside fenced blocks."""
    return re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S))


def commands(text: str, program: str) -> list[str]:
    """Command lines of text that start with `program` (in fenced blocks or inline spans)."""
    return [c for c in code_block_lines(text) + inline_spans(text) if c.startswith(program + " ")]


def resolve(words: list[str]):
    """The click command a `grpolab` argument list names (sub-commands of groups followed), and the words left."""
    command = typer.main.get_command(app)
    while hasattr(command, "commands") and words and not words[0].startswith("-"):
        assert words[0] in command.commands, f"no command {words[0]!r} under {command.name!r}"
        command, words = command.commands[words[0]], words[1:]
    return command, words


def option_names(command) -> set[str]:
    return {name for param in command.params for name in (*param.opts, *param.secondary_opts)}


def flags(words: list[str]) -> list[str]:
    """The --options of an argument list; `[--x]` (optional) counts, `--x=value` is read as --x."""
    return [w.strip("[]").split("=")[0] for w in words if w.strip("[]").startswith("--")]


@pytest.mark.parametrize("path", [README, RESULTS], ids=lambda p: p.name)
def test_every_grpolab_command_and_option_exists(path):
    lines = commands(path.read_text(), "grpolab")
    assert lines, path
    for line in lines:
        words = shlex.split(line)[1:]
        if words and (words[0].startswith("<") or words[0].isupper()):  # `grpolab <command> --help`: a placeholder
            continue
        command, rest = resolve(words)
        known = option_names(command) | {"--help"}
        for flag in flags(rest):
            assert flag in known, f"{path.name}: `{line}`: {flag} is not an option of `{command.name}`"


@pytest.mark.parametrize("path", [README, RESULTS], ids=lambda p: p.name)
def test_every_benchmark_command_names_a_script_and_its_flags(path):
    text = path.read_text()
    scripts = commands(text, "python") + [
        "python " + span for span in inline_spans(text) if re.match(r"benchmarks/\w+\.py ", span)
    ]
    assert scripts, path
    for line in scripts:
        words = line.split()
        script = ROOT / words[1]
        assert script.is_file(), f"{path.name}: `{line}`: no {words[1]}"
        source = script.read_text()
        for flag in flags(words[2:]):
            assert f'"{flag}"' in source, f"{path.name}: `{line}`: {words[1]} has no {flag}"


@pytest.mark.parametrize("path", [README, RESULTS], ids=lambda p: p.name)
def test_every_make_target_exists(path):
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([\w-]+):", makefile, re.M))
    for line in commands(path.read_text(), "make"):
        target = line.split()[1]
        if "=" not in target:
            assert target in targets, f"{path.name}: `{line}`: no Makefile target {target!r}"


@pytest.mark.parametrize("path", [README, RESULTS], ids=lambda p: p.name)
def test_every_repository_path_and_link_exists(path):
    text = path.read_text()
    named = set(re.findall(r"\b((?:docs|configs|benchmarks|examples)/[\w./-]+\.(?:md|yaml|py))", text))
    linked = {(path.parent / target).resolve() for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text)}
    assert named or linked
    for name in named:
        assert (ROOT / name).is_file(), f"{path.name} names {name}, which does not exist"
    for target in linked:
        assert target.is_file(), f"{path.name} links to {target.relative_to(ROOT)}, which does not exist"


def test_the_readme_is_short_and_the_quick_tour_comes_first():
    text = README.read_text()
    assert len(text.split()) <= MAX_README_WORDS, len(text.split())
    tour_line = text.splitlines().index("## A quick tour") + 1
    assert tour_line <= MAX_LINE_OF_QUICK_TOUR, tour_line


def test_every_headline_interval_of_the_readme_is_on_the_results_page():
    readme = README.read_text()
    results_section = readme[readme.index("## Results") :]
    results_section = results_section[: results_section.index("\n## ", 1)]
    headline = re.findall(r"[+-]\d\.\d{3} \[[+-]\d\.\d{3}, [+-]\d\.\d{3}\]", results_section)
    assert len(headline) >= 3, headline  # math, code, agents
    results = RESULTS.read_text()
    for figure in headline:
        assert figure in results, f"README headline {figure} is not on docs/results.md"
