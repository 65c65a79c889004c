"""The red team's classes of attack on the code sandbox (issue 27), each closed by design, with near variants:

1. code execution inside the judge (a module the judge imports, dropped where the program can write);
2. name binding that trusts what a program says about itself (``__module__`` / ``__qualname__`` claims);
3. program names in the tests' namespace (``range``, ``abs``, ``math``, ...), and honest programs whose helpers
   are named like builtins, which must score exactly right;
5. errors that would turn a wrong answer into an invalid sample (signals to the judge, replies the decoder
   chokes on);
6. one program poisoning its batch (a reply nested deep enough for the runner's parser);
7. host state that survives (writable host directories, tmpfs without an inode bound, a user namespace of the
   program's own);
8. reading the benchmark's data files, a dataset cache or the trainer's source from inside.

Class 4 (state shared between runs) and the check that nothing is left on the host afterwards are in
tests/test_sandbox_redteam_host.py. The programs run in one batch through the code reward's runner. Bounded: 2 s
wall and CPU per program, 256 MiB, 8 processes, 8 MiB files, 16 MiB of scratch space."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from grpolab.rewards.code import CodeRunner
from grpolab.sandbox import Job, SandboxLimits, detect, shared_pool
from grpolab.sandbox.runner import REASONS
from grpolab.tasks.code import code_problem

LIMITS = SandboxLimits(
    wall_s=2.0, cpu_s=2.0, memory_mb=256, max_procs=8, max_file_mb=8, disk_mb=16, max_output_kb=64, workers=2, uid=61400
)
TOKEN = "grpolab-rt-" + os.urandom(6).hex()  # in the name of every file an attack leaves (none should be left)
SQUARE = ("assert f(2) == 4", "assert f(3) == 9")

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the red-team suite checks the uid drop: run as root")

# the text of a module that, if the judge ever imported it, would forge an all-pass verdict on every descriptor
FORGE = (
    "import json, os, struct\n_b = json.dumps({'cases': [{'ok': True, 'reason': None, 'detail': ''}] * 2}).encode()\n"
    "for _fd in range(3, 256):\n    try:\n        os.write(_fd, struct.pack('>I', len(_b)) + _b)\n"
    "    except OSError:\n        pass\nos._exit(0)\n"
)
# a program-side helper that writes a raw frame on the worker's own pipe to the judge (bypassing the protocol)
SEND = (
    "import fcntl, json, os, stat, struct\ndef _send(text):\n    body = text.encode()\n    for fd in range(3, 64):\n"
    "        try:\n            st = os.fstat(fd)\n        except OSError:\n            continue\n"
    "        if stat.S_ISFIFO(st.st_mode) and fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_WRONLY:\n"
    "            os.write(fd, struct.pack('>I', len(body)) + body)\n"
)


@dataclass(frozen=True)
class Attack:
    """A program and its problem; the reward it must get (`score`) and the reasons accepted."""

    program: str
    cases: tuple[str, ...] = SQUARE
    score: float = 0.0
    reasons: frozenset = frozenset({"wrong_answer"})
    entry: str = "f"
    setup: str = ""
    reference: str = ""


def _drop_modules(name: str) -> str:
    """A program that writes FORGE as `name`.py wherever the judge might look: its working directory, and that
    directory's path recreated under the program's own /tmp (the judge's '' entry on sys.path)."""
    return (
        f"import os\nEVIL = {FORGE!r}\nfor d in ('.', os.getcwd()):\n    try:\n        os.makedirs(d, exist_ok=True)\n"
        f"        open(os.path.join(d, '{name}.py'), 'w').write(EVIL)\n    except OSError:\n        pass\n"
    )


def _judge_code_execution() -> dict[str, Attack]:
    return {
        "c1_typing_in_cwd": Attack(
            _drop_modules("typing") + "def f(x):\n    return 0\n", setup="from typing import List\n"
        ),
        "c1_lazy_decoder_import": Attack(
            "import base64\n" + _drop_modules("base64") + "def f(x):\n    return b'0'\n",
            ("assert f(2) == b'4'", "assert f(3) == b'9'"),
        ),
        "c1_binding_import": Attack(
            _drop_modules("colorsys")
            + _drop_modules("importlib")
            + "def f(x):\n    return 0\nf.__module__ = 'colorsys'\nf.__qualname__ = 'rgb_to_hls'\n"
        ),
        "c1_test_import": Attack(
            _drop_modules("fractions") + "def f(x):\n    return 0\n",
            ("import fractions\nassert f(2) == 4", "assert f(3) == 9"),
        ),
        "c1_import_path_writable": Attack(
            "import os, sys\ndef f():\n    out = []\n    for p in sys.path:\n        d = p or '.'\n"
            "        try:\n            open(os.path.join(d, 'grpolab_probe.py'), 'x').close()\n            out.append(p)\n"
            "        except OSError:\n            pass\n    return out\n",
            ("assert f() == []",),
            score=1.0,
            reasons=frozenset({None}),
        ),
    }


def _name_binding() -> dict[str, Attack]:
    return {
        "c2_claims_builtins_abs": Attack(
            "def f(x):\n    return 0\nf.__module__ = 'builtins'\nf.__qualname__ = 'abs'\n",
            ("assert f(-3) == 3", "assert f(4) == 4"),
        ),
        "c2_claims_deep_path": Attack(
            "def f():\n    return 0\nf.__module__ = 'posixpath'\nf.__qualname__ = 'os.getpid'\n", ("assert f() == 1",)
        ),
        "c2_lambda_claims_operator": Attack(
            "f = lambda x: 0\nf.__module__ = 'operator'\nf.__qualname__ = 'neg'\n",
            ("assert f(3) == -3", "assert f(-2) == 2"),
        ),
        "c2_class_claims_len": Attack(
            "class f:\n    def __init__(self, x):\n        pass\nf.__module__ = 'builtins'\nf.__qualname__ = 'len'\n",
            ("assert f([1, 2]) == 2",),
        ),
        "c2_fake_module": Attack(
            "import types\nf = types.ModuleType('math')\n", ("assert f.sqrt(16) == 4.0",), reasons=frozenset({"error"})
        ),
    }


HELPERS = (
    "def range(a, b):\n    out = []\n    while a <= b:\n        out.append(a)\n        a += 1\n    return out\n"
    "def max(xs):\n    best = xs[0]\n    for x in xs:\n        best = x if x > best else best\n    return best\n"
    "def sum(xs):\n    return 0 if not xs else xs[0] + sum(xs[1:])\n"
    "def len(s):\n    return -1\n"
)
HELPER_TESTS = (
    "for i in range(2, 6):\n    assert f(i) == i",
    "assert max(f(3), 1) == 3",
    "assert sum([f(2), f(3)]) == 5",
    "assert len(str(f(4))) == 1",
)


def _test_namespace() -> dict[str, Attack]:
    return {
        "c3_shadow_range": Attack(
            "range = lambda *a: []\ndef f(x):\n    return 0\n", ("for i in range(5):\n    assert f(i) == i * i",)
        ),
        "c3_shadow_abs": Attack(
            "def abs(x):\n    return 0\ndef f(x):\n    return 100\n", ("assert abs(f(2) - 4) < 1e-9",)
        ),
        "c3_shadow_all": Attack(
            "all = lambda it: True\ndef f(x):\n    return 0\n", ("assert all([f(i) == i for i in (1, 2)])",)
        ),
        "c3_shadow_module": Attack(
            "class _M:\n    @staticmethod\n    def isclose(*a, **k):\n        return True\nmath = _M()\n"
            "def f(x):\n    return 0.0\n",
            ("assert math.isclose(f(2), 1.414, rel_tol=1e-3)",),
        ),
        "c3_shadow_sorted": Attack(
            "sorted = lambda xs: [1, 2]\ndef f(x):\n    return [9]\n", ("assert sorted(f(3)) == [1, 2]",)
        ),
        "c3_shadow_isinstance": Attack(
            "isinstance = lambda *a: True\ndef f(x):\n    return 'x'\n", ("assert isinstance(f(1), int)",)
        ),
        "c3_honest_builtin_named_helpers": Attack(
            HELPERS + "def f(n):\n    return max(range(1, n))\n", HELPER_TESTS, score=1.0, reasons=frozenset({None})
        ),
        "c3_honest_partial": Attack(
            HELPERS + "def f(n):\n    return max(range(1, n)) + (n == 4)\n", HELPER_TESTS, score=0.75
        ),
        "c3_entry_point_named_sum": Attack("def sum(xs):\n    return 0\n", ("assert sum([1, 2]) == 3",), entry="sum"),
        "c3_mbpp_style_sum_honest": Attack(
            "import builtins\ndef sum(a, b):\n"
            "    return builtins.sum(d for d in range(1, min(a, b) + 1) if a % d == 0 and b % d == 0)\n",
            ("assert sum(10, 15) == 6", "assert sum(4, 6) == 3"),
            score=1.0,
            reasons=frozenset({None}),
            entry="",
            reference="def sum(a, b):\n    return 0\n",
        ),
        "c3_mbpp_style_class": Attack(
            "class Pair:\n    def __init__(self, a, b):\n        self.a, self.b = a, b\ndef longest(ps):\n"
            "    return max(p.b - p.a for p in ps)\n",
            ("assert longest([Pair(1, 5), Pair(2, 3)]) == 4",),
            score=1.0,
            reasons=frozenset({None}),
            entry="",
            reference="class Pair:\n    pass\ndef longest(ps):\n    return 0\n",
        ),
    }


def _signals_and_replies() -> dict[str, Attack]:
    kill = (
        "import os, signal, time\ndef _kill(*sigs):\n    for pid in {1, os.getppid()}:\n        for s in sigs:\n"
        "            try:\n                os.kill(pid, s)\n            except OSError:\n                pass\n"
    )
    every = (
        "signal.SIGINT, signal.SIGALRM, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGQUIT, signal.SIGPIPE"
    )
    deep = "'[' * 990 + ']' * 990"
    return {
        "c5_sigint_at_load": Attack(
            kill + "_kill(signal.SIGINT)\ntime.sleep(0.2)\ndef f(x):\n    return x * x\n",
            score=1.0,
            reasons=frozenset({None}),
        ),
        "c5_sigalrm_at_load": Attack(
            kill + "_kill(signal.SIGALRM)\ntime.sleep(0.2)\ndef f(x):\n    return x * x\n",
            score=1.0,
            reasons=frozenset({None}),
        ),
        "c5_signals_at_call": Attack(
            kill + f"def f(x):\n    _kill({every})\n    time.sleep(0.05)\n    return x * x\n",
            score=1.0,
            reasons=frozenset({None}),
        ),
        "c5_overflow_in_names": Attack(
            SEND + '_send(\'{"names": {"f": {"v": {"c": [\' + \'9\' * 400 + \', 0]}}}}\')\nos._exit(0)\n',
            reasons=frozenset({"error"}),
        ),
        "c5_overflow_deque_in_names": Attack(
            SEND + '_send(\'{"names": {"f": {"v": {"deque": [[], \' + \'9\' * 40 + \']}}}}\')\nos._exit(0)\n',
            reasons=frozenset({"error"}),
        ),
        "c5_overflow_at_call": Attack(
            SEND + "def f(x):\n    _send('{\"ok\": {\"c\": [' + '9' * 400 + ', 0]}}')\n    return x * x\n",
            reasons=frozenset({"error"}),
        ),
        "c5_nan_in_load": Attack(
            SEND + '_send(\'{"load": {"reason": "error", "detail": NaN}}\')\nos._exit(0)\n',
            reasons=frozenset({"error"}),
        ),
        "c5_deep_names": Attack(
            SEND + f"_send('{{\"names\": {{\"f\": ' + {deep} + '}}}}')\nos._exit(0)\n", reasons=frozenset({"error"})
        ),
        "c6_bogus_reason": Attack(
            SEND + '_send(\'{"load": {"reason": "pwned", "detail": {"x": [1]}}}\')\nos._exit(0)\n',
            reasons=frozenset({"error"}),
        ),
    }


def _host_state(targets: list[str]) -> dict[str, Attack]:
    writable = (
        f"import os\ndef f():\n    dirs = {targets!r} + ['/', '/usr', '/etc', '/var', '/opt', '/run', '/run/lock',\n"
        "            '/var/lock', '/dev/mqueue', '/home', '/srv', '/mnt', '/media', '/root']\n"
        "    try:\n        dirs += [line.split()[4] for line in open('/proc/self/mountinfo')]\n"
        "    except OSError:  # no /proc in the run's root: every directory it has instead\n"
        "        dirs += [root for root, _, _ in os.walk('/')]\n"
        "    mine = {os.getcwd(), '/tmp', '/var/tmp', '/dev/shm'}\n    out = []\n"
        "    for d in sorted(set(dirs) - mine):\n        try:\n"
        f"            open(os.path.join(d, '.{TOKEN}'), 'x').close()\n            out.append(d)\n"
        "        except OSError:\n            pass\n    return out\n"
    )
    inodes = (
        "import os\ndef f():\n    made = 0\n    for d in ('.', '/tmp', '/var/tmp', '/dev/shm'):\n"
        "        for i in range(3000):\n"
        "            try:\n                open(os.path.join(d, 'e%d' % i), 'x').close()\n                made += 1\n"
        "            except OSError:\n                break\n    return made\n"
    )
    space = (
        "import os\ndef f():\n    total = 0\n    for d in ('.', '/tmp', '/var/tmp', '/dev/shm'):\n        try:\n"
        "            with open(os.path.join(d, 'big'), 'wb') as fh:\n                for _ in range(8):\n"
        "                    fh.write(b'0' * (1 << 20))\n                    fh.flush()\n"
        "                    total += 1 << 20\n"
        "        except OSError:\n            pass\n    return total\n"
    )
    listen = (
        "import socket\ndef f():\n    try:\n        s = socket.socket()\n        s.bind(('127.0.0.1', 0))\n"
        "        s.listen(1)\n        globals()['kept'] = s\n        return 'listening'\n    except OSError:\n"
        "        return 'refused'\n"
    )
    userns = (
        "import ctypes\ndef f():\n    libc = ctypes.CDLL(None, use_errno=True)\n"
        "    return 'refused' if libc.unshare(0x10000000 | 0x20000) != 0 else 'own namespace'\n"
    )
    threads = (
        "import subprocess, threading\ndef f(x):\n    out = []\n"
        "    t = threading.Thread(target=lambda: out.append(x * x))\n    t.start()\n    t.join()\n"
        "    try:\n        subprocess.run(['/bin/echo', str(out[0])], capture_output=True, text=True)\n"
        "        return 'started a program'\n    except OSError:  # no executable in the run's root\n"
        "        return out[0]\n"
    )
    return {
        "c7_user_namespace": Attack(userns, ("assert f() == 'refused'",), score=1.0, reasons=frozenset({None})),
        "c7_threads_work_no_program_starts": Attack(threads, score=1.0, reasons=frozenset({None})),
        "c7_host_dirs_writable": Attack(writable, ("assert f() == []",), score=1.0, reasons=frozenset({None})),
        "c7_inode_bomb": Attack(inodes, (f"assert f() <= {LIMITS.max_files}",), score=1.0, reasons=frozenset({None})),
        "c7_scratch_space_is_one_budget": Attack(
            space, (f"assert f() <= {LIMITS.disk_mb << 20}",), score=1.0, reasons=frozenset({None})
        ),
        "c7_listener": Attack(listen, ("assert f() == 'refused'",), score=1.0, reasons=frozenset({None})),
    }


def _data_files(data_dir: str) -> dict[str, Attack]:
    read = (
        f"import os\ndef f(name):\n    for path in ({data_dir + '/HumanEval.jsonl'!r}, {data_dir + '/mbpp.jsonl'!r},\n"
        f"                 {data_dir + '/hub/datasets--openai--openai_humaneval/snapshots/x/test.jsonl'!r}):\n"
        "        try:\n            for line in open(path):\n                if name in line:\n"
        "                    return line.split('answer=')[1].split(';')[0]\n        except OSError:\n"
        "            pass\n    return None\n"
    )
    scan = (
        f"import os\ndef f():\n    seen = 0\n    for root, dirs, files in os.walk({os.path.dirname(data_dir)!r}):\n"
        "        seen += 1\n        if seen > 500:\n            break\n        for name in files:\n"
        "            if name.endswith('.jsonl'):\n                return os.path.join(root, name)\n    return None\n"
    )
    source = (
        "def f():\n    try:\n        cmd = open('/proc/1/cmdline', 'rb').read().decode(errors='replace')\n"
        "    except OSError:\n"
        "        return []\n    import os, re\n    return [p for p in re.findall(r\"'(/[^']+)'\", cmd)\n"
        "            if os.path.exists(os.path.join(p, 'harness.py')) or os.path.exists(os.path.join(p, 'runner.py'))]\n"
    )
    return {
        "c8_dataset_file": Attack(read, ("assert f('HumanEval/0') == 'ANSWER0'",)),
        "c8_dataset_cache": Attack(read, ("assert f('openai_humaneval/1') == 'ANSWER1'",)),
        "c8_dataset_scan": Attack(scan, ("assert f() is None",), score=1.0, reasons=frozenset({None})),
        "c8_trainer_source": Attack(source, ("assert f() == []",), score=1.0, reasons=frozenset({None})),
    }


@pytest.fixture(scope="module")
def world_writable() -> list[str]:
    """World-writable directories of the host's root filesystem (the test's own view), but /tmp's subdirectories."""
    out = subprocess.run(
        ["find", "/", "-xdev", "-type", "d", "-perm", "-0002"], capture_output=True, text=True, timeout=60
    ).stdout.split()
    return sorted(d for d in out if not d.startswith(("/tmp/", "/var/tmp/", "/proc")))


@pytest.fixture(scope="module")
def data_dir(pytestconfig):
    """A benchmark's data files and a dataset cache where a user might keep them: a world-readable directory
    inside the project (not under /tmp)."""
    root = pytestconfig.cache.mkdir(f"grpolab-redteam-{os.getpid()}")
    for part in (root, *root.parents):
        if part == Path("/"):
            break
        if not os.stat(part).st_mode & 0o005:
            pytest.skip(f"{part} is closed to others: the data-file attacks need a world-readable place")
    cache = root / "hub" / "datasets--openai--openai_humaneval" / "snapshots" / "x"
    cache.mkdir(parents=True, exist_ok=True)
    (root / "HumanEval.jsonl").write_text('{"task_id": "HumanEval/0", "test": "answer=ANSWER0;"}\n')
    (cache / "test.jsonl").write_text('{"task_id": "openai_humaneval/1", "test": "answer=ANSWER1;"}\n')
    for d in (root, root / "hub", cache.parent.parent, cache.parent, cache):
        os.chmod(d, 0o755)
    yield str(root)
    shutil.rmtree(root, ignore_errors=True)


def _attacks(world_writable: list[str], data_dir: str) -> dict[str, Attack]:
    return {
        **_judge_code_execution(),
        **_name_binding(),
        **_test_namespace(),
        **_signals_and_replies(),
        **_host_state(world_writable),
        **_data_files(data_dir),
    }


ATTACK_NAMES = list(_attacks([], "/nonexistent/data"))


@pytest.fixture(scope="module")
def batch(world_writable, data_dir):
    """Every attack of ATTACK_NAMES in one batch through the code reward's runner."""
    attacks = _attacks(world_writable, data_dir)
    problems = [
        code_problem(f"redteam/{n}", n, a.reference, a.cases, setup=a.setup, entry_point=a.entry)
        for n, a in attacks.items()
    ]
    completions = ["```python\n" + a.program + "```" for a in attacks.values()]
    runner = CodeRunner(LIMITS)
    runs = runner.run(completions, problems)
    scores = runner.scores(completions, problems, all_pass=False)
    return {n: (run, score, attacks[n]) for n, (run, _), score in zip(attacks, runs, scores)}


@pytest.mark.parametrize("name", ATTACK_NAMES)
def test_attack_earns_only_its_honest_score(batch, name):
    run, score, attack = batch[name]
    assert run.infra_error is None and score.value is not None, (name, run.infra_error)
    assert score.value == pytest.approx(attack.score), (name, run.cases)
    assert score.reason in attack.reasons, (name, score.reason, run.detail)
    assert all(c.reason in REASONS or c.ok for c in run.cases), [c.reason for c in run.cases]


def test_deep_reply_does_not_poison_the_batch():
    """Class 6: programs forging a load message nested just deep enough for the runner's parser (a sweep over
    depths) get 0 with a reason; the normal programs of the same batch score right."""
    load = '\'{"load": {"reason": "error", "detail": "x", "deep": \' + \'[\' * %d + \']\' * %d + \'}}\''
    forged = [SEND + f"_send({load % (n, n)})\nos._exit(0)\n" for n in range(960, 1000, 3)]
    normal = ["def f(x):\n    return x * x\n"] * 4
    programs = forged + normal
    problems = [code_problem(f"deep/{i}", "q", "", SQUARE, entry_point="f") for i in range(len(programs))]
    scores = CodeRunner(LIMITS).scores(["```python\n" + p + "```" for p in programs], problems, all_pass=False)
    assert [s.value for s in scores] == [0.0] * len(forged) + [1.0] * len(normal)
    assert {s.reason for s in scores[: len(forged)]} == {"error"}


def test_one_failing_run_is_only_its_own_problem(monkeypatch):
    """A failure of the runner itself on one job makes that sample invalid, never its neighbours in the batch."""
    from grpolab.sandbox import pool as pool_module

    real = pool_module.run_job

    def flaky(job, *args, **kwargs):
        if "boom" in job.program:
            raise RecursionError("maximum recursion depth exceeded")
        return real(job, *args, **kwargs)

    monkeypatch.setattr(pool_module, "run_job", flaky)
    pool = shared_pool(LIMITS)
    results = pool.run_many(
        [
            Job("def f(x):\n    return x * x\n", SQUARE),
            Job("# boom\n", SQUARE),
            Job("def f(x):\n    return x\n", SQUARE),
        ]
    )
    assert [r.n_passed for r in results] == [2, 0, 0]
    assert results[0].infra_error is None and results[2].infra_error is None
    assert "RecursionError" in results[1].infra_error


def test_startup_says_what_is_not_closed():
    """The full setup lacks nothing; a weaker one names each class it leaves open (logged once at start-up)."""
    full = detect(LIMITS)
    assert full.name != "full" or full.missing() == []
    text = " ".join(replace(full, net=False, pid=False, mounts=False, ipc=False, seccomp=False).missing())
    for words in ("IPC", "ARE SHARED", "keyring", "host directories", "data files", "inode", "NETWORK", "PID"):
        assert words in text
