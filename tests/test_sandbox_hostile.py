"""Hostile programs, all in one batch through the code reward's runner: every one gets reward 0 (or its honest
score) with the expected reason, the trainer process and the machine are unharmed (no sandbox process left, the
sentinel intact, no connection to the test's own listener, no secret leaked), and 64 normal programs score
correctly right after. Bounded: 2 s wall and CPU per program, 256 MiB, 8 processes, 8 MiB files, 64 KiB output."""

from __future__ import annotations

import os
import socket
import stat
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from grpolab.rewards.code import CodeRunner
from grpolab.sandbox import Job, SandboxLimits, detect, run_job, shared_pool
from grpolab.sandbox.runner import kill_uid
from grpolab.tasks.code import code_problem

LIMITS = SandboxLimits(
    wall_s=2.0, cpu_s=2.0, memory_mb=256, max_procs=8, max_file_mb=8, max_output_kb=64, workers=2, uid=61000
)
SQUARE = ("assert f(2) == 4", "assert f(3) == 9")
SECRET = "grpolab-secret-" + os.urandom(8).hex()
MARKER = "31.%d" % (os.getpid() % 1000)  # an argument of `sleep` we can find in /proc afterwards

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the hostile suite checks the uid drop: run as root")


def _programs(sentinel: str, port: int) -> dict[str, tuple[str, tuple[str, ...], set[str]]]:
    """name -> (program, tests, accepted reasons)."""
    return {
        "infinite_loop": ("def f(x):\n    while True:\n        pass\n", SQUARE, {"timeout", "limit"}),
        "fork_bomb": (
            "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
            SQUARE,
            {"timeout", "limit"},
        ),
        "memory_bomb": ("x = bytearray(10 * 1024 ** 3)\n", SQUARE, {"limit"}),
        "memory_creep": ("chunks = []\nwhile True:\n    chunks.append(bytearray(32 * 1024 ** 2))\n", SQUARE, {"limit"}),
        "file_10gb": (
            "with open('big.bin', 'wb') as fh:\n    for _ in range(10 * 1024):\n        fh.write(b'0' * 1024 ** 2)\n",
            SQUARE,
            {"limit"},
        ),
        "stdout_100mb": (
            "import sys\nsys.stdout.write('x' * 100_000_000)\nsys.stdout.flush()\ndef f(x):\n    return x * x\n",
            SQUARE,
            {"limit"},
        ),
        "deep_recursion": (
            "import sys\nsys.setrecursionlimit(10 ** 7)\ndef g(n):\n    return g(n + 1) + 1\ng(0)\n",
            SQUARE,
            {"error", "limit", "timeout"},
        ),
        "sentinel": (
            f"import os\ntry:\n    os.remove({sentinel!r})\nexcept OSError:\n    pass\ntry:\n"
            f"    open({sentinel!r}, 'w').write('pwned')\nexcept OSError:\n    pass\ndef f(x):\n    return 0\n",
            SQUARE,
            {"wrong_answer"},
        ),
        "env_secret": (
            "import glob, os\nfound = os.environ.get('GRPOLAB_HOSTILE_SECRET', '')\n"
            "for path in glob.glob('/proc/*/environ'):\n    try:\n        data = open(path, 'rb').read()\n"
            "    except OSError:\n        continue\n    if b'GRPOLAB_HOSTILE_SECRET=' in data:\n"
            "        found = data.split(b'GRPOLAB_HOSTILE_SECRET=')[1].split(b'\\0')[0].decode()\n"
            "def f(x):\n    return found\n",
            (f"assert f(0) == {SECRET!r}",),
            {"wrong_answer"},
        ),
        "socket": (
            f"import socket\ndef f(x):\n    try:\n        s = socket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
            "        s.sendall(b'leak')\n        return 'connected'\n    except OSError as e:\n        return 'blocked'\n",
            ("assert f(0) == 'connected'",),
            {"wrong_answer"},
        ),
        "sys_exit": ("import sys\nsys.exit(0)\ndef f(x):\n    return x * x\n", SQUARE, {"exit"}),
        "sys_exit_in_test": ("import sys\ndef f(x):\n    sys.exit(0)\n", SQUARE, {"exit"}),
        "os_exit": ("import os\nos._exit(0)\n", SQUARE, {"exit"}),
        "kill_parent": (
            f"import os, signal\nfor pid in (os.getppid(), {os.getpid()}):\n    try:\n        os.kill(pid, 9)\n"
            "    except OSError:\n        pass\ntry:\n    os.kill(-1, 9)\nexcept OSError:\n    pass\n",
            SQUARE,
            {"error", "exit"},
        ),
        "signal_tampering": (
            "import signal\nfor s in (signal.SIGTERM, signal.SIGINT, signal.SIGALRM, signal.SIGXCPU, "
            "signal.SIGHUP):\n    signal.signal(s, signal.SIG_IGN)\n"
            "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGALRM})\n"
            "def f(x):\n    while True:\n        pass\n",
            SQUARE,
            {"timeout", "limit"},
        ),
        "always_equal": (
            "class Always:\n    def __eq__(self, other):\n        return True\n    def __ne__(self, other):\n"
            "        return False\n    __hash__ = object.__hash__\ndef f(x):\n    return Always()\n",
            SQUARE,
            {"wrong_answer"},
        ),
        "int_subclass_equal": (
            "class I(int):\n    def __eq__(self, other):\n        return True\n    __hash__ = int.__hash__\n"
            "def f(x):\n    return I(0)\n",
            SQUARE,
            {"wrong_answer"},
        ),
        "monkeypatch_harness": (
            "import builtins, sys\nfake = lambda *a, **k: {'cases': [{'ok': True, 'reason': None}] * 2}\n"
            "for mod in list(sys.modules.values()):\n"
            "    for name in ('judge', 'classify', 'run_judge', 'outcome', 'verdict', 'check'):\n"
            "        if hasattr(mod, name):\n            try:\n                setattr(mod, name, fake)\n"
            "            except Exception:\n                pass\n"
            "builtins.AssertionError = type('Nope', (Exception,), {})\n"
            "def f(x):\n    return -1\n",
            SQUARE,
            {"wrong_answer"},
        ),
        "success_marker": (
            "import json, os, struct\nbody = json.dumps({'cases': [{'ok': True, 'reason': None, 'detail': ''}] * 2,"
            " 'ready': True}).encode()\nfor fd in range(1, 64):\n    try:\n"
            "        os.write(fd, struct.pack('>I', len(body)) + body)\n    except OSError:\n        pass\n"
            "print('ALL TESTS PASSED')\nprint('{\"ok\": true}')\n",
            SQUARE,
            {"error"},
        ),
        "forge_result_pipe": (
            "import json, os, struct\nbody = json.dumps({'cases': [{'ok': True}] * 2}).encode()\n"
            "for pid in ('1', str(os.getppid()), 'self'):\n    for fd in range(64):\n        try:\n"
            "            with open(f'/proc/{pid}/fd/{fd}', 'wb') as fh:\n"
            "                fh.write(struct.pack('>I', len(body)) + body)\n        except OSError:\n"
            "            pass\ndef f(x):\n    return 0\n",
            SQUARE,
            {"wrong_answer", "error"},
        ),
        "setsid_escapee": (
            f"import os, time\nif os.fork() == 0:\n    os.setsid()\n    try:\n"
            f"        os.execv('/bin/sleep', ['sleep', '{MARKER}'])\n    finally:\n        time.sleep(60)\n"
            "        os._exit(0)\n"
            "def f(x):\n    return 0\n",
            SQUARE,
            {"wrong_answer"},
        ),
    }


def _uid_procs(uids: range) -> int:
    count = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                line = next(
                    ln for ln in Path(f"/proc/{entry}/status").read_text().splitlines() if ln.startswith("Uid:")
                )
            except (OSError, StopIteration):
                continue
            count += int(line.split()[1]) in uids
    return count


def _marker_procs() -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if MARKER.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                    found.append(int(entry))
            except OSError:
                pass
    return found


@pytest.fixture(scope="module")
def hostile():
    """Run every hostile program in one batch; record what the machine looked like meanwhile and afterwards."""
    sentinel_dir = tempfile.mkdtemp(prefix="grpolab-sentinel-")
    os.chmod(sentinel_dir, 0o755)  # others may enter (they still may not write)
    sentinel = os.path.join(sentinel_dir, "sentinel.txt")
    Path(sentinel).write_text("intact")
    os.chmod(sentinel, stat.S_IRUSR | stat.S_IWUSR | stat.S_IRGRP | stat.S_IROTH)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.settimeout(0.2)
    accepted: list = []
    stop = threading.Event()

    def accept_loop():
        while not stop.is_set():
            try:
                accepted.append(listener.accept())
            except OSError:
                pass

    pool = shared_pool(LIMITS)  # the pool the code reward's runner uses
    uids = range(LIMITS.uid + pool.first_slot, LIMITS.uid + pool.first_slot + pool.size)
    peak = [0]

    def sample_loop():
        while not stop.is_set():
            peak[0] = max(peak[0], _uid_procs(uids))
            time.sleep(0.02)

    threads = [threading.Thread(target=accept_loop, daemon=True), threading.Thread(target=sample_loop, daemon=True)]
    for t in threads:
        t.start()
    os.environ["GRPOLAB_HOSTILE_SECRET"] = SECRET
    programs = _programs(sentinel, listener.getsockname()[1])
    names = list(programs)
    problems = [code_problem(f"hostile/{n}", n, "", programs[n][1], entry_point="f") for n in names]
    completions = ["```python\n" + programs[n][0] + "```" for n in names]
    runner = CodeRunner(LIMITS)
    started = time.monotonic()
    try:
        runs = runner.run(completions, problems)
        scores = runner.scores(completions, problems, all_pass=False)
    finally:
        elapsed = time.monotonic() - started
        del os.environ["GRPOLAB_HOSTILE_SECRET"]
        time.sleep(0.3)
        stop.set()
        for t in threads:
            t.join(5)
        listener.close()
    after = {
        "uid_procs": _uid_procs(uids),
        "markers": _marker_procs(),
        "sentinel": Path(sentinel).read_text(),
        "accepted": len(accepted),
        "peak_uid_procs": peak[0],
        "elapsed": elapsed,
    }
    yield {n: (run, score) for n, (run, _), score in zip(names, runs, scores)}, programs, runner, after
    for pid in after["markers"]:
        os.kill(pid, 9)


@pytest.mark.parametrize("name", list(_programs("/x", 1)))
def test_hostile_program_scores_zero_with_its_reason(hostile, name):
    results, programs, _, _ = hostile
    run, score = results[name]
    assert run.infra_error is None, run.infra_error
    assert score.value == 0.0, (name, run.cases)
    assert score.reason in programs[name][2], (name, score.reason, run.detail)


def test_machine_unharmed(hostile):
    _, _, _, after = hostile
    assert after["sentinel"] == "intact"
    assert after["accepted"] == 0, "a sandboxed program connected to 127.0.0.1"
    assert after["uid_procs"] == 0, "a sandbox process outlived its run"
    assert after["markers"] == [], "a setsid child outlived its run"
    assert after["elapsed"] < 60


def test_limits_were_what_stopped_them(hostile):
    results, _, _, after = hostile
    assert 3 <= after["peak_uid_procs"] <= LIMITS.max_procs * LIMITS.pool_size  # max_procs per slot uid
    assert "MemoryError" in results["memory_bomb"][0].detail
    assert "File too large" in results["file_10gb"][0].detail
    stdout = results["stdout_100mb"][0]
    assert stdout.killed == "output" and len(stdout.stdout) <= LIMITS.max_output_kb * 1024
    assert results["socket"][0].cases[0].detail.startswith("assertion failed")


def test_normal_programs_score_right_after(hostile):
    _, _, runner, _ = hostile
    problems, completions, expected = [], [], []
    for i in range(64):
        k = i % 7 + 2
        problems.append(
            code_problem(
                f"normal/{i}",
                "q",
                "",
                (f"assert g({k}) == {k * k}", "assert g(-1) == 1", "assert g(0) == 0"),
                entry_point="g",
            )
        )
        body = "return x * x" if i % 2 == 0 else ("return abs(x)" if i % 4 == 1 else "return x +")
        completions.append(f"```python\ndef g(x):\n    {body}\n```")
        expected.append(1.0 if i % 2 == 0 else (2 / 3 if i % 4 == 1 else 0.0))
    scores = runner.scores(completions, problems, all_pass=False)
    assert [round(s.value, 6) for s in scores] == [round(e, 6) for e in expected]
    assert [s.reason for s in scores][:4] == [None, "wrong_answer", None, "syntax"]


def _socket_job(port: int) -> Job:
    program = (
        f"import socket\ndef f():\n    try:\n        socket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
        "        return 'connected'\n    except OSError as e:\n        return str(e)\n"
    )
    return Job(program, ("assert f() == 'connected'",))


@pytest.mark.parametrize("setup", ["netns_only", "seccomp_only"])
def test_each_network_barrier_alone_blocks_localhost(setup):
    """The network namespace without the seccomp filter, and the seccomp filter without a network namespace (the
    fallback), each keep a program from reaching a listener on 127.0.0.1."""
    full = detect(LIMITS)
    if not full.net:
        pytest.skip("no network namespace on this machine")
    iso = (
        replace(full, seccomp=False)
        if setup == "netns_only"
        else replace(full, unshare=tuple(a for a in full.unshare if a != "--net"), net=False)
    )
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(3)
    try:
        result = run_job(_socket_job(listener.getsockname()[1]), LIMITS, iso, 3)
        with pytest.raises(socket.timeout):
            listener.accept()
    finally:
        listener.close()
    assert not result.all_passed and result.infra_error is None
    assert result.cases[0].reason == "wrong_answer"


def test_setsid_escapee_killed_without_pid_namespace():
    """Without a PID namespace (a fallback), the runner finds the sandbox uid's processes and kills them."""
    full = detect(LIMITS)
    if not full.unshare:
        pytest.skip("no unshare on this machine")
    iso = replace(full, unshare=(full.unshare[0], "--net"), pid=False, mounts=False)
    marker = "32.%d" % (os.getpid() % 1000)
    program = f"import os\nif os.fork() == 0:\n    os.setsid()\n    os.execv('/bin/sleep', ['sleep', '{marker}'])\n"
    result = run_job(Job(program, ("assert False",)), LIMITS, iso, 4)
    assert result.infra_error is None
    alive = [e for e in os.listdir("/proc") if e.isdigit() and _cmdline_has(e, marker)]
    assert alive == []
    assert kill_uid(LIMITS.uid + 4) == 0


def _cmdline_has(pid: str, marker: str) -> bool:
    try:
        return marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
