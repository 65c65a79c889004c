"""Code tasks: pyfunc (generator, disjoint split, hidden tests), MBPP and HumanEval loaders (local data; skipped
cleanly when the shared data folder is missing), bad rows naming the file and line, the prompt and data hash."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grpolab.errors import ConfigError, DataError
from grpolab.manifest import data_hash, problem_hashes
from grpolab.tasks import CODE_INSTRUCTION, PROMPT_INSTRUCTION, Problem, make_task, render_prompt
from grpolab.tasks.code import code_problem, is_code_problem
from grpolab.tasks.pyfunc import split_of
from grpolab.tasks.pyfunc_templates import TEMPLATES

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
needs = lambda name: pytest.mark.skipif(not (DATA / name).is_dir(), reason=f"no {DATA / name}")  # noqa: E731


def test_pyfunc_split_is_disjoint_and_stable():
    task = make_task("pyfunc", seed=3)
    train, test = task.problems("train"), task.problems("test")
    assert not {p.uid for p in train} & {p.uid for p in test}
    assert not set(problem_hashes(train)) & set(problem_hashes(test))
    for p in train[:20] + test[:20]:
        identity = p.uid.removeprefix("pyfunc/")
        assert split_of(identity, 0.3) == ("test" if p in test else "train")
    assert [p.uid for p in make_task("pyfunc", seed=3, num_train=5).problems("test")] == [p.uid for p in test]
    assert len(make_task("pyfunc", num_test=7).problems("test")) == 7
    assert len(train) + len(test) == len(task.identities())


def test_pyfunc_template_split_holds_out_whole_templates():
    task = make_task("pyfunc", split_by="template")
    keys = lambda ps: {p.uid.removeprefix("pyfunc/").split(":")[0] for p in ps}  # noqa: E731
    assert not keys(task.problems("train")) & keys(task.problems("test"))


def test_pyfunc_tests_are_hidden_and_correct():
    for p in make_task("pyfunc").problems("test")[:40]:
        data = p.data
        assert is_code_problem(p) and p.instruction == CODE_INSTRUCTION
        assert len(data["shown"]) == 2 and len(data["tests"]) == 6
        assert not set(data["shown"]) & set(data["tests"])
        for shown in data["shown"]:
            assert shown in p.question
        for hidden in data["tests"]:
            assert hidden not in p.question
        calls = [t.split(" == ")[0] for t in data["shown"] + data["tests"]]
        assert len(set(calls)) == len(calls)  # distinct inputs
    for p in make_task("pyfunc").problems("train") + make_task("pyfunc").problems("test"):
        assert len({t.split(" == ")[1] for t in p.data["tests"]}) >= 2, p.uid  # a constant function cannot pass


def test_pyfunc_references_pass_their_tests():
    """Every template's reference, written as the function the prompt asks for, satisfies its asserts."""
    task = make_task("pyfunc", hidden_tests=4)
    for template, param, identity in task.identities()[::7]:
        p = task.problem(template, param, identity)
        name = p.data["entry_point"]
        namespace = {name: template.make(param)}
        for statement in p.data["shown"] + p.data["tests"]:
            exec(statement, namespace)


def test_pyfunc_knobs_and_errors():
    levels1 = make_task("pyfunc", levels=1)
    assert all(t.level == 1 for t, _, _ in levels1.identities())
    assert {t.family for t, _, _ in make_task("pyfunc", families="str,list").identities()} == {"str", "list"}
    assert len({t.key for t in TEMPLATES}) == len(TEMPLATES)
    with pytest.raises(ConfigError, match=r"task\.options\.levels"):
        make_task("pyfunc", levels="4")
    with pytest.raises(ConfigError, match=r"task\.options\.families"):
        make_task("pyfunc", families="int,float")
    with pytest.raises(ConfigError, match=r"task\.options\.split_by"):
        make_task("pyfunc", split_by="seed")
    with pytest.raises(ConfigError, match=r"task\.options\.hidden_tests"):
        make_task("pyfunc", hidden_tests=0)


def test_prompt_and_data_hash():
    math_problem = Problem("a/1", "What is 1 + 1?", "2")
    assert render_prompt(math_problem) == "What is 1 + 1?\n" + PROMPT_INSTRUCTION
    code = code_problem("c/1", "Write f.", "def f(): pass", ["assert f() is None"], entry_point="f")
    assert render_prompt(code) == "Write f.\n" + CODE_INSTRUCTION
    hash(code)  # hashable despite the mapping
    other = code_problem("c/1", "Write f.", "def f(): pass", ["assert f() == 1"], entry_point="f")
    assert data_hash([code]) != data_hash([other])  # the tests are part of the data hash
    # answer tasks keep the hash they always had: sha256 of [[uid, question, answer], ...]
    import hashlib

    assert (
        data_hash([math_problem]) == hashlib.sha256(json.dumps([["a/1", "What is 1 + 1?", "2"]]).encode()).hexdigest()
    )


@needs("mbpp")
def test_mbpp_standard_split():
    task = make_task("mbpp", path=str(DATA / "mbpp"))
    sizes = {s: len(task.problems(s)) for s in ("train", "test", "validation", "prompt")}
    assert sizes == {"train": 374, "test": 500, "validation": 90, "prompt": 10}
    p = task.problems("train")[0]
    assert p.uid == "mbpp/601" and len(p.data["tests"]) == 3 and p.data["shown"] == p.data["tests"][:1]
    assert p.data["tests"][0] in p.question and p.data["tests"][1] not in p.question
    assert len(make_task("mbpp", path=str(DATA / "mbpp"), show_tests=3).problems("train")[0].data["shown"]) == 3
    with pytest.raises(ConfigError, match="split"):
        task.problems("dev")


@needs("humaneval")
def test_humaneval_rows():
    problems = make_task("humaneval", path=str(DATA / "humaneval")).problems("test")
    assert len(problems) == 164
    p = problems[0]
    assert p.uid == "humaneval/0" and p.data["tests"] == ("check(__solution__('has_close_elements'))",)
    assert p.data["prefix"] in p.answer and "def check(candidate)" in p.data["setup"]
    with pytest.raises(ConfigError, match="only a 'test' split"):
        make_task("humaneval", path=str(DATA / "humaneval")).problems("train")


def test_bad_rows_name_file_and_line(tmp_path):
    (tmp_path / "mbpp.jsonl").write_text(json.dumps({"task_id": 601, "text": "t", "code": "c", "test_list": []}) + "\n")
    with pytest.raises(DataError, match=r"mbpp\.jsonl:1: field 'test_list'"):
        make_task("mbpp", path=str(tmp_path)).problems("train")
    (tmp_path / "HumanEval.jsonl").write_text(json.dumps({"task_id": "HumanEval/0", "prompt": "def f():\n"}) + "\n")
    with pytest.raises(DataError, match=r"HumanEval\.jsonl:1: missing or empty field 'canonical_solution'"):
        make_task("humaneval", path=str(tmp_path)).problems("test")
    with pytest.raises(DataError, match="file not found"):
        make_task("mbpp", path=str(tmp_path / "nowhere")).problems("test")
    with pytest.raises(ConfigError, match=r"task\.options\.show_tests"):
        make_task("mbpp", path=str(tmp_path), show_tests=5)
