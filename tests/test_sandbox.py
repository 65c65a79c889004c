"""The sandbox: value codec and frames (pure), limits, isolation detection, and runs of ordinary programs:
values that must cross the wire, partial credit, timeouts with an honest partial score, the private temp dir."""

from __future__ import annotations

import collections
import math
import os
from dataclasses import replace

import pytest

from grpolab.sandbox import Job, SandboxLimits, detect, shared_pool
from grpolab.sandbox.errors import SandboxConfigError, SandboxError
from grpolab.sandbox.harness import classify, load_reason
from grpolab.sandbox.isolation import candidates
from grpolab.sandbox.runner import frame, parse_frames, verdict
from grpolab.sandbox.wire import OpaqueValue, ProtocolError, decode, encode, pack_frame, rebuild_set

LIMITS = SandboxLimits(wall_s=3.0, cpu_s=3.0, memory_mb=256, max_procs=8, workers=2, uid=61100)

VALUES = [
    None,
    True,
    0,
    -7,
    2**100,
    1.5,
    float("inf"),
    "x\udcff\n",
    [1, [2]],
    (1, (2, "a")),
    {1: "a", (2, 3): [4]},
    {5, 6},
    frozenset({1}),
    b"\x00\xff",
    bytearray(b"ab"),
    1 + 2j,
    range(1, 9, 2),
    collections.Counter("aab"),
    collections.OrderedDict([(2, 1), (1, 2)]),
    collections.defaultdict(list, {1: [2]}),
    collections.deque([1, 2], maxlen=3),
    int,
    str,
]


@pytest.mark.parametrize("value", VALUES, ids=lambda v: type(v).__name__)
def test_codec_roundtrip_keeps_type_and_value(value):
    back = decode(encode(value, None), None)
    assert type(back) is type(value)
    assert back == value or (isinstance(value, float) and math.isnan(value) and math.isnan(back))
    if isinstance(value, collections.defaultdict):
        assert back.default_factory is list
    if isinstance(value, collections.deque):
        assert back.maxlen == 3


def test_codec_nan_and_nesting():
    assert math.isnan(decode(encode(float("nan"), None), None))
    deep: list = []
    for _ in range(150):
        deep = [deep]
    with pytest.raises(ValueError):
        encode(deep, None)
    with pytest.raises(ProtocolError):
        decode({"t": [1], "s": [2]}, None)  # two tags
    with pytest.raises(ProtocolError):
        decode({"zz": 1}, None)


def test_codec_refuses_objects_without_a_handle_table():
    class Always:
        def __eq__(self, other):
            return True

    class MyInt(int):
        pass

    for obj in (Always(), MyInt(3), [Always()], {"k": lambda: 1}):
        with pytest.raises(OpaqueValue):
            encode(obj, None)
    handles: list = []
    assert encode(MyInt(3), lambda v: handles.append(v) or {"h": len(handles) - 1}) == {"h": 0}


def test_set_order_survives_the_wire():
    literal = {12, 13, 14, 15, 16}  # iterates 16 first: a set's order depends on how it was built
    assert list(rebuild_set(list(literal), set)) == list(literal)
    assert list(decode(encode(literal, None), None)) == list(literal)


def test_frames():
    frames, rest = parse_frames(frame({"ready": True}) + frame({"cases": []}) + b"\x00\x00")
    assert frames == [{"ready": True}, {"cases": []}] and rest == b"\x00\x00"
    assert pack_frame([1]) == b"\x00\x00\x00\x03[1]"


def test_verdict_tells_sandbox_failures_from_program_failures():
    ok = {"cases": [{"ok": True}, {"ok": False, "reason": "wrong_answer", "detail": "x"}]}
    cases, infra = verdict([{"ready": True}, ok], None, "", 2)
    assert [c.ok for c in cases] == [True, False] and infra is None
    assert verdict([], None, "unshare: failed", 1)[1].startswith("the sandbox failed")  # never started
    assert verdict([{"setup_error": "OSError"}], None, "", 1)[1] is not None
    assert verdict([{"ready": True}, {"judge_error": "x"}], None, "", 1)[1] is not None
    assert verdict([{"ready": True}], "timeout", "", 1)[0][0].reason == "timeout"
    assert verdict([{"ready": True}], "output", "", 1)[0][0].reason == "limit"
    assert verdict([{"ready": True}], None, "", 1)[0][0].reason == "exit"  # the judge was killed
    assert verdict([{"ready": True}, {"cases": [{"ok": True}]}], None, "", 2)[1] is not None  # wrong case count


def test_reasons():
    assert load_reason(SyntaxError("x"), True) == "syntax"
    assert load_reason(OSError(27, "File too large"), False) == "limit"
    assert load_reason(ValueError("x"), False) == "error"
    assert classify(AssertionError())[0] == "wrong_answer"
    assert classify(OpaqueValue("x"))[0] == "wrong_answer"


def test_limits_options():
    limits = SandboxLimits.from_options({"wall_s": "2.5", "max_procs": 4})
    assert limits.wall_s == 2.5 and limits.max_procs == 4
    assert limits.rlimits()["RLIMIT_NPROC"] == (4, 4)
    with pytest.raises(SandboxConfigError, match=r"reward\.sandbox\.wal_s: unknown"):
        SandboxLimits.from_options({"wal_s": 1})
    with pytest.raises(SandboxConfigError, match=r"reward\.sandbox\.memory_mb: expected >= 64"):
        SandboxLimits.from_options({"memory_mb": 1})
    with pytest.raises(SandboxConfigError, match=r"reward\.sandbox\.max_procs: expected an integer"):
        SandboxLimits.from_options({"max_procs": 2.5})
    assert SandboxLimits(workers=3).pool_size == 3 and SandboxLimits().pool_size >= 1


def test_candidates_order():
    assert [c.name for c in candidates(None, True, True)] == ["rlimits"]
    assert [c.name for c in candidates("/u", False, False)] == ["user-ns", "rlimits"]
    assert all(c.uid_drop for c in candidates("/u", True, True))
    assert any("NETWORK ACCESS IS NOT BLOCKED" in m for m in candidates(None, False, False)[0].missing())


def test_bad_interpreter_is_one_clear_error():
    with pytest.raises(SandboxError, match="sandbox: no setup could run a program"):
        detect(replace(LIMITS, python="/nonexistent/python3"))


@pytest.fixture(scope="module")
def pool():
    return shared_pool(LIMITS)


def _run(pool, program, cases, setup=""):
    return pool.run_many([Job(program, tuple(cases), setup)])[0]


def test_values_cross_the_wire(pool):
    program = (
        "import collections, math\nclass Node:\n    def __init__(self, v):\n        self.v, self.left = v, None\n"
        "def depth(n):\n    return 0 if n is None else 1 + depth(n.left)\n"
        "def gen(n):\n    yield from range(n)\ndef counts(s):\n    return collections.Counter(s)\n"
        "def root(x):\n    return math.sqrt(x)\n"
    )
    cases = [
        "assert depth(tree) == 2",
        "assert list(gen(3)) == [0, 1, 2]",
        "assert counts('aab') == {'a': 2, 'b': 1}",
        "assert math.isclose(root(2.0), 1.41421356, rel_tol=1e-6)",
        "assert str(depth) != ''",
        "assert 2 in gen(3)",
        "assert len(list(gen(4))) == 4",
    ]
    result = _run(pool, program, cases, setup="tree = Node(1)\ntree.left = Node(2)\n")
    assert [c.ok for c in result.cases] == [True] * len(cases), result.cases


LOOP_ON_3 = "def f(x):\n    while x == 3:\n        pass\n    return x * x\n"
SQUARE_CASES = ["assert f(2) == 4", "assert f(3) == 9", "assert f(4) == 16"]


def test_partial_credit_and_honest_timeout():
    """The wall clock ends the run: every case from the hung one on is a timeout. The CPU limit is set far above
    the wall limit so that it cannot fire first (with cpu_s == wall_s the two race: which one a busy loop meets
    first depends on the machine)."""
    result = _run(shared_pool(replace(LIMITS, cpu_s=30.0)), LOOP_ON_3, SQUARE_CASES)
    assert [c.ok for c in result.cases] == [True, False, False]
    assert [c.reason for c in result.cases] == [None, "timeout", "timeout"]


def test_cpu_limit_is_a_limit_not_a_timeout():
    """A busy loop that meets the CPU limit long before the wall clock is a limit hit, for the hung case and the
    rest (the program is gone)."""
    result = _run(shared_pool(replace(LIMITS, cpu_s=1.0, wall_s=20.0)), LOOP_ON_3, SQUARE_CASES)
    assert [c.ok for c in result.cases] == [True, False, False]
    assert [c.reason for c in result.cases] == [None, "limit", "limit"]


def test_program_errors_have_reasons(pool):
    cases = ["assert f(1) == 1"]
    assert _run(pool, "def f(x) return x", cases).reason == "syntax"
    assert _run(pool, "def f(x):\n    return 1 / 0\n", cases).reason == "error"
    assert _run(pool, "def g(x):\n    return x\n", cases).reason == "error"  # NameError: no f
    assert _run(pool, "def f(x):\n    return 2\n", cases).reason == "wrong_answer"
    assert _run(pool, "def f(x):\n    raise MemoryError\n", cases).reason == "limit"
    exc = _run(pool, "def f(x):\n    raise ValueError('no')\n", ["try:\n    f(1)\nexcept ValueError:\n    pass"])
    assert exc.all_passed  # a test may catch the program's exception by its built-in class


def test_environment_and_directory_are_private(pool):
    os.environ["GRPOLAB_TEST_SECRET"] = "s3cret"
    try:
        program = (
            "import os\nopen('scratch.txt', 'w').write('x')\n"
            "def env():\n    return sorted(os.environ)\ndef cwd_files():\n    return sorted(os.listdir('.'))\n"
            "def uid():\n    return os.getuid()\ndef tmp():\n    return sorted(os.listdir('/tmp'))\n"
        )
        result = _run(
            pool,
            program,
            [
                "assert 'GRPOLAB_TEST_SECRET' not in env()",
                "assert cwd_files() == ['scratch.txt']",
                "assert len(env()) <= 6",
            ]
            + (["assert uid() >= 61100", "assert tmp() == []"] if os.geteuid() == 0 else []),
        )
    finally:
        del os.environ["GRPOLAB_TEST_SECRET"]
    assert result.all_passed, result.cases


def test_working_directories_are_removed(pool):
    import tempfile

    before = {d for d in os.listdir(tempfile.gettempdir()) if d.startswith("grpolab-sbx-")}
    pool.run_many([Job("open('a', 'w').write('x' * 100)\n", ("assert True",)) for _ in range(4)])
    after = {d for d in os.listdir(tempfile.gettempdir()) if d.startswith("grpolab-sbx-")}
    assert after <= before


def test_a_working_directory_that_resists_removal_is_retried_then_warned_of(tmp_path, monkeypatch):
    """A removal that fails once (a file written while it was removed) is retried and succeeds; one that keeps
    failing leaves a warning naming the directory and the error, never a silent leftover."""
    import re
    import shutil

    from grpolab.sandbox import runner

    workdir = tmp_path / "grpolab-sbx-x"
    workdir.mkdir()
    (workdir / "late").write_text("x")
    calls, rmtree = [], shutil.rmtree

    def racing_rmtree(path):
        calls.append(path)
        if len(calls) == 1:
            raise OSError(39, "Directory not empty", path)
        rmtree(path)

    monkeypatch.setattr(runner.shutil, "rmtree", racing_rmtree)
    runner.remove_workdir(str(workdir), delays=(0.0, 0.0))
    assert not workdir.exists() and len(calls) == 2

    workdir.mkdir()
    monkeypatch.setattr(runner.shutil, "rmtree", lambda path: (_ for _ in ()).throw(OSError(16, "busy", path)))
    with pytest.warns(
        RuntimeWarning, match=f"could not remove its working directory {re.escape(str(workdir))}: .*busy"
    ):
        runner.remove_workdir(str(workdir), delays=(0.0, 0.0))
    assert workdir.exists()
