"""The third red-team pass on the code judge (issue 47), classes 1, 4 and 5, and the judge's call-by-call feedback
(the oracle of class 2); the state shared between runs and the costs left on the host are in
tests/test_sandbox_hostile3_host.py.

1. a wrong answer made invalid by the judge's own deadline: signals to the judge (kill, killpg, every kind, a
   flood that outlives the program), signals the kernel sends for the program (F_SETOWN / F_SETSIG / O_ASYNC on
   its own pipe: no kill() at all), a huge load message or reply timed to the deadline;
4. the judge under the worker's uid: prlimit on the judge, signals to it where there is no PID namespace;
5. core dumps: re-enabling dumping, raising RLIMIT_CORE, a crash after both, an exec that would reset them;
and feedback: every assert of a test runs whatever the earlier ones returned, so a program learns nothing from
which calls the judge makes.

Every attack must earn exactly its honest score (`score`), with one of the accepted reasons and never an
infrastructure error (which the reward would turn into an invalid sample). Bounded: 3 s wall, 2 s CPU, 256 MiB,
8 processes, 8 MiB files per program; a flood of signals ends with its run's PID namespace."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass

import pytest

from grpolab.sandbox import Job, SandboxLimits, SandboxPool, detect, run_job
from grpolab.sandbox.isolation import candidates

LIMITS = SandboxLimits(
    wall_s=3.0, cpu_s=2.0, memory_mb=256, max_procs=8, max_file_mb=8, disk_mb=16, max_output_kb=64, workers=2, uid=62800
)
SQUARE = ("assert f(2) == 4", "assert f(3) == 9")
SLOW_ON_3 = "def f(x):\n    if x == 3:\n        time.sleep(100)\n    return x * x\n"  # honest: 0.5, then the deadline

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the hostile suite checks the uid drop: run as root")

# a child of the program that sends `sigs` to the judge (pid 1 in its PID namespace, else the parent) and to the
# whole process group until the run is torn down; it ignores them itself
FLOOD = (
    "import os, signal, time\n"
    "def _flood(*sigs, group=False):\n"
    "    for s in sigs:\n        if s not in (signal.SIGKILL, signal.SIGSTOP):\n            signal.signal(s, signal.SIG_IGN)\n"
    "    targets = {1, os.getppid()}\n"
    "    if os.fork() == 0:\n"
    "        while True:\n"
    "            for s in sigs:\n"
    "                for pid in targets:\n"
    "                    try:\n                        os.kill(pid, s)\n"
    "                    except OSError:\n                        pass\n"
    "                if group:\n"
    "                    try:\n                        os.killpg(0, s)\n"
    "                    except OSError:\n                        pass\n"
    "            time.sleep(0.001)\n"
    "        os._exit(0)\n"
)
# the kernel signals the judge whenever this pipe is written to (F_SETOWN to the judge, F_SETSIG to SIGALRM)
FASYNC = (
    "import fcntl, os, signal, time\n"
    "def _fasync(sig):\n"
    "    try:\n        r, w = os.pipe()\n    except OSError:\n        return\n"  # pipes are refused now (hostile4)
    "    for pid in (os.getppid(), 1):\n"
    "        try:\n            fcntl.fcntl(r, 8, pid)\n            break\n"  # F_SETOWN
    "        except OSError:\n            pass\n"
    "    fcntl.fcntl(r, 10, sig)\n"  # F_SETSIG
    "    fcntl.fcntl(r, fcntl.F_SETFL, fcntl.fcntl(r, fcntl.F_GETFL) | os.O_ASYNC)\n"
    "    if os.fork() == 0:\n"
    "        while True:\n"
    "            os.write(w, b'x')\n            os.read(r, 1)\n            time.sleep(0.0005)\n"
)
PRLIMIT = (
    "import os, resource\n"
    "def _prlimit(res, value):\n"
    "    done = []\n"
    "    for pid in {1, os.getppid()}:\n"
    "        try:\n            resource.prlimit(pid, res, value)\n            done.append(pid)\n"
    "        except OSError:\n            pass\n"
    "    return done\n"
)
LIBC = "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"


@dataclass(frozen=True)
class Attack:
    """A program and its tests; the reward it must earn (`score`), the reasons accepted for its failing tests,
    and text its stdout must show (the calls the judge made)."""

    program: str
    cases: tuple[str, ...] = SQUARE
    score: float = 0.0
    reasons: frozenset = frozenset({"wrong_answer"})
    setup: str = ""
    stdout_has: tuple[str, ...] = ()


def _late_deadline() -> dict[str, Attack]:
    timeout = frozenset({"timeout"})
    every = (
        "signal.SIGALRM, signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, "
        "signal.SIGPIPE, signal.SIGXCPU, signal.SIGIO, signal.SIGVTALRM, signal.SIGPROF, signal.SIGQUIT"
    )
    big_names = "globals().update(('v%d' % i, i) for i in range(200000))\n"
    timed_reply = (
        f"T0 = time.monotonic()\ndef f(x):\n    if x == 3:\n        time.sleep(max(0.0, T0 + {LIMITS.wall_s - 0.25} - time.monotonic()))\n"
        "        return list(range(1500000))\n    return x * x\n"
    )
    return {
        "c1_sigalrm_flood_past_deadline": Attack(
            FLOOD + "_flood(signal.SIGALRM)\n" + SLOW_ON_3, score=0.5, reasons=timeout
        ),
        "c1_fasync_sigalrm_no_kill_call": Attack(
            FASYNC + "_fasync(signal.SIGALRM)\n" + SLOW_ON_3, score=0.5, reasons=timeout
        ),
        "c1_fasync_sigint_no_kill_call": Attack(
            FASYNC + "_fasync(signal.SIGINT)\n" + SLOW_ON_3, score=0.5, reasons=timeout
        ),
        "c1_killpg_flood": Attack(
            FLOOD + "_flood(signal.SIGALRM, group=True)\n" + SLOW_ON_3, score=0.5, reasons=timeout
        ),
        "c1_every_signal_past_deadline": Attack(FLOOD + f"_flood({every})\n" + SLOW_ON_3, score=0.5, reasons=timeout),
        "c1_huge_load_message_late": Attack(
            FLOOD + big_names + "_flood(signal.SIGALRM)\n" + SLOW_ON_3, score=0.5, reasons=timeout
        ),
        "c1_huge_reply_at_deadline": Attack(
            FLOOD + "_flood(signal.SIGALRM)\n" + timed_reply,
            score=0.5,
            reasons=frozenset({"timeout", "wrong_answer", "error"}),
        ),
        "c1_early_sigalrm_honest": Attack(
            "import os, signal\ndef _alarm():\n    try:\n        os.kill(os.getppid(), signal.SIGALRM)\n"
            "    except OSError:\n        pass\nfor _ in range(5):\n    _alarm()\n"
            "def f(x):\n    _alarm()\n    return x * x\n",
            score=1.0,
            reasons=frozenset(),
        ),
        "c1_sigstop_judge": Attack(
            FLOOD.replace("while True", "for _ in range(3)") + "_flood(signal.SIGSTOP)\ndef f(x):\n    return x * x\n",
            score=1.0,
            reasons=frozenset(),
        ),
        "c1_sigkill_judge": Attack(
            FLOOD.replace("while True", "for _ in range(3)") + "_flood(signal.SIGKILL)\n"
            "def f(x):\n    time.sleep(0.05)\n    return x * x\n",
            score=1.0,
            reasons=frozenset(),
        ),
        "c1_closes_its_pipe_and_lives": Attack(
            "import os, time\ndef f(x):\n    os.closerange(3, 64)\n    time.sleep(100)\n",
            reasons=frozenset({"exit", "timeout"}),
        ),
    }


def _judge_uid() -> dict[str, Attack]:
    frac = ("assert f(2) == 4", "assert fractions.Fraction(f(3)) == 9")
    return {
        "c4_prlimit_judge_open_files": Attack(
            PRLIMIT + "_prlimit(resource.RLIMIT_NOFILE, (3, 3))\ndef f(x):\n    return x * x\n",
            frac,
            score=1.0,
            reasons=frozenset(),
        ),
        "c4_prlimit_judge_memory": Attack(
            PRLIMIT + "_prlimit(resource.RLIMIT_AS, (1 << 20, 1 << 20))\ndef f(x):\n    return [x] * 200000\n",
            ("assert f(2) == [2] * 200000", "assert f(3) == [3] * 200000"),
            score=1.0,
            reasons=frozenset(),
        ),
        "c4_prlimit_judge_cpu": Attack(
            PRLIMIT + "_prlimit(resource.RLIMIT_CPU, (1, 1))\ndef f(x):\n    return list(range(x * 150000))\n",
            ("assert f(2) == list(range(300000))", "assert f(3) == list(range(450000))"),
            score=1.0,
            reasons=frozenset(),
        ),
        "c4_prlimit_reports_refused": Attack(
            PRLIMIT + "def f():\n    return _prlimit(resource.RLIMIT_NOFILE, (16, 16))\n",
            ("assert f() == []",),
            score=1.0,
            reasons=frozenset(),
        ),
    }


def _core_dumps() -> dict[str, Attack]:
    dumpable = LIBC + "def f():\n    libc.prctl(4, 1, 0, 0, 0)\n    return libc.prctl(3, 0, 0, 0, 0)\n"
    core = (
        "import resource\ndef f():\n    for value in ((resource.RLIM_INFINITY,) * 2, (1 << 30, 1 << 30), (4096, 4096)):\n"
        "        try:\n            resource.setrlimit(resource.RLIMIT_CORE, value)\n        except (OSError, ValueError):\n"
        "            pass\n    return resource.getrlimit(resource.RLIMIT_CORE)\n"
    )
    crash = (
        LIBC
        + "import os, resource\ndef f():\n    pid = os.fork()\n    if pid == 0:\n        libc.prctl(4, 1, 0, 0, 0)\n"
        "        try:\n            resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY,) * 2)\n"
        "        except (OSError, ValueError):\n            pass\n        os.abort()\n"
        "    _, status = os.waitpid(pid, 0)\n    return os.WCOREDUMP(status)\n"
    )
    exec_ = (
        "import os, sys\ndef f():\n    try:\n        r, w = os.pipe()\n    except OSError:\n        return 'no exec'\n"
        "    pid = os.fork()\n    if pid == 0:\n        os.dup2(w, 1)\n"
        "        code = 'import ctypes, resource; print(ctypes.CDLL(None).prctl(3, 0, 0, 0, 0), resource.getrlimit(resource.RLIMIT_CORE)[1])'\n"
        "        try:\n            os.execv(sys.executable, [sys.executable, '-S', '-c', code])\n        finally:\n"
        "            os._exit(127)\n    os.close(w)\n    out = os.read(r, 200).decode().split()\n    os.waitpid(pid, 0)\n"
        "    return 'no exec' if len(out) != 2 else ('never dumps' if out[1] == '1' else 'dumpable %s, core limit %s' % tuple(out))\n"
    )
    return {
        "c5_dumpable_cannot_be_reenabled": Attack(dumpable, ("assert f() == 0",), score=1.0, reasons=frozenset()),
        # 1 is the kernel's "never" for every core_pattern (0 stops a file dump but not a pipe to a helper)
        "c5_core_limit_stays_the_never_value": Attack(core, ("assert f()[1] == 1",), score=1.0, reasons=frozenset()),
        "c5_crash_after_reenabling_dumps_nothing": Attack(
            crash, ("assert f() is False",), score=1.0, reasons=frozenset()
        ),
        "c5_exec_cannot_reset_dumping": Attack(
            exec_, ("assert f() in ('no exec', 'never dumps')",), score=1.0, reasons=frozenset()
        ),
    }


def _feedback() -> dict[str, Attack]:
    calls = "def f(x):\n    print('called', x, flush=True)\n    return -1\n"
    return {
        "c2_every_assert_runs": Attack(
            calls,
            ("assert f(1) == 1\nassert f(2) == 4\nassert f(3) == 9",),
            stdout_has=("called 1", "called 2", "called 3"),
        ),
        "c2_every_loop_assert_runs": Attack(
            calls, ("for i in range(5):\n    assert f(i) == i * i",), stdout_has=tuple(f"called {i}" for i in range(5))
        ),
        "c2_assert_message_never_calls_the_program": Attack(
            calls,
            ("assert f(1) == 1, f(100)\nassert f(2) == 4, 'constant messages are kept'",),
            stdout_has=("called 1", "called 2"),
        ),
        "c2_every_assert_of_a_check_function_runs": Attack(
            calls,
            ("check(f)",),
            setup="def check(candidate):\n    assert candidate(1) == 1\n    assert candidate(2) == 4\n",
            stdout_has=("called 1", "called 2"),
        ),
    }


def _kernel_objects() -> dict[str, Attack]:
    """Found by a red team after the redesign: a socket pair kept files in flight after the run (memory held on the
    host, a count read by the next run on the slot), memfd pages outside every limit, and a StopIteration that ended
    the test's own ``map`` loop."""
    made = LIBC + "def f():\n    fds = (ctypes.c_int * 2)()\n"
    return {
        "c3_socketpair_refused": Attack(
            made + "    return libc.socketpair(1, 1, 0, fds)\n", ("assert f() == -1",), score=1.0, reasons=frozenset()
        ),
        "c3_memfd_refused": Attack(
            made + "    return libc.memfd_create(b'm', 0)\n", ("assert f() == -1",), score=1.0, reasons=frozenset()
        ),
        "a1_stop_iteration_does_not_end_a_map": Attack(
            "def f(x):\n    raise StopIteration\n",
            ("assert all(map(f, [2, 3]))", "assert sum(map(f, [2])) == 0"),
            score=0.0,
            reasons=frozenset({"error"}),
        ),
    }


ATTACKS = {**_late_deadline(), **_judge_uid(), **_core_dumps(), **_feedback(), **_kernel_objects()}


@pytest.fixture(scope="module")
def batch():
    pool = SandboxPool(LIMITS)
    names = list(ATTACKS)
    jobs = [Job(ATTACKS[n].program, ATTACKS[n].cases, ATTACKS[n].setup, entry_points=("f",)) for n in names]
    results = dict(zip(names, pool.run_many(jobs)))
    pool.close()
    return results


def _check(attack: Attack, result) -> None:
    assert result.infra_error is None, result.infra_error
    assert result.n_passed / len(result.cases) == attack.score, (
        result.cases,
        result.stdout[-300:],
        result.stderr[-300:],
    )
    assert {c.reason for c in result.cases if not c.ok} <= attack.reasons, result.cases
    for text in attack.stdout_has:
        assert text in result.stdout, (text, result.stdout[-300:])
    if attack.stdout_has:  # the judge called the program exactly these times, whatever it answered
        assert result.stdout.count("called") == len(attack.stdout_has), result.stdout[-300:]


@pytest.mark.parametrize("name", list(ATTACKS))
def test_attack_earns_only_its_honest_score(batch, name):
    """Each attack of classes 1, 4, 5 and the feedback checks: its honest score exactly, never an invalid sample."""
    _check(ATTACKS[name], batch[name])


def _no_pid_namespace():
    """The root setup without a PID or mount namespace (``unshare --net --ipc``): the judge is not PID 1, so only
    its own uid keeps the program's signals and prlimit away from it."""
    if not shutil.which("unshare"):
        pytest.skip("no unshare here")
    return next(c for c in candidates(shutil.which("unshare"), True, detect(LIMITS).seccomp) if c.name == "net")


# programs that import only what the judge has loaded already (the sandbox uid may not reach the interpreter's
# files here without a mount namespace)
NO_PIDNS = {
    "c4_sigkill_judge_without_pid_namespace": "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n",
    "c4_sigstop_judge_without_pid_namespace": "import os, signal\nos.kill(os.getppid(), signal.SIGSTOP)\n",
    "c4_prlimit_judge_without_pid_namespace": "import os, resource\nresource.prlimit(os.getppid(), resource.RLIMIT_CPU, (1, 1))\n"
    "resource.prlimit(os.getppid(), resource.RLIMIT_NOFILE, (3, 3))\n",
}


@pytest.mark.parametrize("name", list(NO_PIDNS))
def test_judge_out_of_reach_without_a_pid_namespace(name):
    """Class 4 where no PID namespace protects the judge: its own uid does; a correct program scores 1.0."""
    iso = _no_pid_namespace()
    program = (
        "try:\n"
        + "".join("    " + ln + "\n" for ln in NO_PIDNS[name].splitlines())
        + "except OSError:\n    pass\ndef f(x):\n    return x * x\n"
    )
    result = run_job(Job(program, SQUARE, entry_points=("f",)), LIMITS, iso, 9)
    assert result.infra_error is None and result.all_passed, result.cases


def test_private_image_holds_the_standard_library_and_nothing_of_the_host():
    """The per-run copy (grpolab.sandbox.image): compiled modules only, no test suite or source, the extension
    modules and the libraries they need; and a program in the run's root finds no file the image does not hold."""
    import io
    import sys
    import zipfile

    from grpolab.sandbox.image import stdlib_image

    image = stdlib_image(sys.executable)
    assert image is not None
    with open(f"/proc/self/fd/{image.zip_fd}", "rb") as fh:
        names = set(zipfile.ZipFile(io.BytesIO(fh.read())).namelist())
    assert {"collections/__init__.pyc", "fractions.pyc", "encodings/idna.pyc"} <= names
    assert not any(n.startswith(("test/", "idlelib/", "asyncio/")) or n.endswith(".py") for n in names)
    allowed = sorted(
        set(image.files) | {image.zip_path} | {f"/dev/{d}" for d in ("null", "zero", "full", "random", "urandom")}
    )
    program = (
        f"import os\nALLOWED = set({allowed!r})\ndef f():\n    found = []\n"
        "    for root, dirs, files in os.walk('/'):\n        found += [os.path.join(root, n) for n in files]\n"
        "    return sorted(p for p in found if p not in ALLOWED)\n"
    )
    result = run_job(Job(program, ("assert f() == []",), entry_points=("f",)), LIMITS, detect(LIMITS), 10)
    assert result.infra_error is None and result.all_passed, result.cases


def test_fallback_root_still_judges(monkeypatch):
    """Where the private copy cannot be built, the run falls back to read-only views of the host's directories
    (documented, with a warning) and still judges right."""
    from grpolab.sandbox import runner

    monkeypatch.setattr(runner, "stdlib_image", lambda python: None)
    program = "import fractions\ndef f(x):\n    return x * x if x != 3 else 0\n"
    result = run_job(Job(program, SQUARE, entry_points=("f",)), LIMITS, detect(LIMITS), 10)
    assert result.infra_error is None and [c.ok for c in result.cases] == [True, False]
