"""Class 4 of the red team's attacks on the code sandbox (issue 27): state shared between runs (SysV shared
memory, semaphores, message queues, POSIX message queues, the sandbox uid's kernel keyring), each barrier (IPC
namespace, seccomp filter) also alone; then, after every sandbox suite of this session, the check that nothing is
left on the host -- no file of an attack outside the sandbox's own directories, no SysV object, message queue,
key, process or socket of a sandbox uid, no working directory -- and that normal programs still score right.

The cross-run attacks run one after another on one slot (the same sandbox uid). Bounded as in
tests/test_sandbox_redteam.py."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from sandbox_normal import assert_normal_programs_score_exactly, sandbox_processes, sandbox_workdirs

from grpolab.sandbox import Job, SandboxLimits, detect, run_job

LIMITS = SandboxLimits(
    wall_s=2.0, cpu_s=2.0, memory_mb=256, max_procs=8, max_file_mb=8, disk_mb=16, max_output_kb=64, workers=2, uid=61400
)
SANDBOX_UIDS = range(LIMITS.uid, LIMITS.uid + 16)  # the red-team suites' uids
CROSS_RUN_SLOT = 6  # run_job's slot for the cross-run attacks (pools of these suites take slots 0 and 1)
TOKEN = "grpolab-rt-" + os.urandom(6).hex()
IPC_KEY = 0x67720000 + os.getpid() % 0xFFFF
X86_64 = platform.machine() == "x86_64"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the red-team suite checks the uid drop: run as root")

LIBC = "import ctypes, ctypes.util\nlibc = ctypes.CDLL(None, use_errno=True)\n"
IPC = {  # kind -> (writer, reader returning what the writer left)
    "shm": (
        LIBC + f"i = libc.shmget({IPC_KEY}, 4096, 0o1000 | 0o666)\nassert i >= 0, ctypes.get_errno()\n"
        "libc.shmat.restype = ctypes.c_void_p\na = libc.shmat(i, None, 0)\nctypes.memmove(a, b'ANSWER', 6)\n",
        LIBC + f"def f():\n    i = libc.shmget({IPC_KEY}, 0, 0)\n    if i < 0:\n        return None\n"
        "    libc.shmat.restype = ctypes.c_void_p\n    return ctypes.string_at(libc.shmat(i, None, 0), 6).decode()\n",
    ),
    "sem": (
        LIBC + f"i = libc.semget({IPC_KEY + 1}, 1, 0o1000 | 0o666)\nassert i >= 0\nlibc.semctl(i, 0, 16, 42)\n",
        LIBC + f"def f():\n    i = libc.semget({IPC_KEY + 1}, 0, 0)\n"
        "    return 'ANSWER' if i >= 0 and libc.semctl(i, 0, 12) == 42 else None\n",
    ),
    "msg": (
        LIBC + f"i = libc.msgget({IPC_KEY + 2}, 0o1000 | 0o666)\nassert i >= 0\n"
        "m = ctypes.create_string_buffer(ctypes.sizeof(ctypes.c_long) + 6)\nctypes.c_long.from_buffer(m).value = 1\n"
        "m[ctypes.sizeof(ctypes.c_long):] = b'ANSWER'\nlibc.msgsnd(i, m, 6, 0)\n",
        LIBC + f"def f():\n    i = libc.msgget({IPC_KEY + 2}, 0)\n    if i < 0:\n        return None\n"
        "    m = ctypes.create_string_buffer(64)\n    n = libc.msgrcv(i, m, 32, 0, 0o4000)\n"
        "    at = ctypes.sizeof(ctypes.c_long)\n    return None if n < 0 else m.raw[at:at + n].decode()\n",
    ),
    "mqueue": (
        LIBC + "rt = ctypes.CDLL(ctypes.util.find_library('rt') or None, use_errno=True)\n"
        f"q = rt.mq_open(b'/{TOKEN}', 0o100 | 2, 0o666, None)\nassert q >= 0, ctypes.get_errno()\n"
        "rt.mq_send(q, b'ANSWER', 6, 0)\n",
        LIBC + "rt = ctypes.CDLL(ctypes.util.find_library('rt') or None, use_errno=True)\n"
        f"def f():\n    q = rt.mq_open(b'/{TOKEN}', 2)\n    if q < 0:\n        return None\n"
        "    m = ctypes.create_string_buffer(8192)\n    n = rt.mq_receive(q, m, 8192, None)\n"
        "    return None if n < 0 else m.raw[:n].decode()\n",
    ),
    "keyring": (
        LIBC + f"k = libc.syscall(248, b'user', b'{TOKEN}', b'ANSWER', 6, -4)\nassert k >= 0\n",
        LIBC + f"def f():\n    k = libc.syscall(250, 10, -4, b'user', b'{TOKEN}', 0)\n"
        "    if k < 0:\n        return None\n"
        "    m = ctypes.create_string_buffer(16)\n    n = libc.syscall(250, 11, k, m, 16)\n"
        "    return None if n < 0 else m.raw[:n].decode()\n",
    ),
}


def _cross_run(kind: str, isolation) -> tuple[object, object]:
    writer, reader = IPC[kind]
    first = run_job(
        Job(writer + "def f():\n    return 'written'\n", ("assert f() == 'written'",)),
        LIMITS,
        isolation,
        CROSS_RUN_SLOT,
    )
    second = run_job(Job(reader, ("assert f() == 'ANSWER'",)), LIMITS, isolation, CROSS_RUN_SLOT)
    return first, second


@pytest.mark.parametrize("kind", list(IPC))
def test_nothing_crosses_from_one_run_to_the_next(kind):
    """Class 4: what one run leaves in SysV IPC, a POSIX message queue or the uid's keyring is gone for the next
    (the writer is refused by the seccomp filter or isolated by the IPC namespace); the reader scores 0."""
    if kind == "keyring" and not X86_64:
        pytest.skip("the keyring program uses x86_64 syscall numbers")
    first, second = _cross_run(kind, detect(LIMITS))
    assert first.infra_error is None and second.infra_error is None
    assert not second.all_passed and second.cases[0].reason == "wrong_answer", (first.cases, second.cases)


@pytest.mark.parametrize("barrier", ["ipc_namespace_only", "seccomp_only"])
def test_each_ipc_barrier_alone_keeps_runs_apart(barrier):
    """The IPC namespace without the seccomp filter, and the seccomp filter without an IPC namespace, each keep a
    SysV segment from one run out of the next and off the host."""
    full = detect(LIMITS)
    if not full.ipc:
        pytest.skip("no IPC namespace on this machine")
    iso = (
        replace(full, seccomp=False)
        if barrier == "ipc_namespace_only"
        else replace(full, unshare=tuple(a for a in full.unshare if a != "--ipc"), ipc=False)
    )
    try:
        first, second = _cross_run("shm", iso)
    finally:
        leftovers = _sysv_leftovers()
        _remove_sysv(leftovers)
    assert leftovers == []
    assert first.infra_error is None and not second.all_passed
    if barrier == "seccomp_only":
        assert "AssertionError" in first.detail or first.cases[0].reason == "error"  # shmget refused


# ------------------------------------------------------------------------------------- after the suite


def _sysv_leftovers() -> list[tuple[str, str]]:
    """(kind, id) of SysV objects owned by the sandbox uids or carrying this suite's keys."""
    out = []
    for kind in ("shm", "sem", "msg"):
        lines = Path(f"/proc/sysvipc/{kind}").read_text().splitlines()
        head = lines[0].split()
        for line in lines[1:]:
            row = dict(zip(head, line.split()))
            if int(row["uid"]) in SANDBOX_UIDS or int(row["key"]) in range(IPC_KEY, IPC_KEY + 3):
                out.append((kind, row[{"shm": "shmid", "sem": "semid", "msg": "msqid"}[kind]]))
    return out


def _remove_sysv(objects: list[tuple[str, str]]) -> None:
    for kind, ident in objects:
        subprocess.run(["ipcrm", {"shm": "-m", "sem": "-s", "msg": "-q"}[kind], ident], capture_output=True)


def _mqueue_left() -> bool:
    """Whether this suite's POSIX message queue exists on the host (removed if so)."""
    libc = ctypes.CDLL(None, use_errno=True)
    rt = ctypes.CDLL(ctypes.util.find_library("rt") or None, use_errno=True) if not hasattr(libc, "mq_open") else libc
    q = rt.mq_open(f"/{TOKEN}".encode(), 0)
    if q < 0:
        return False
    rt.mq_close(q)
    rt.mq_unlink(f"/{TOKEN}".encode())
    return True


def _key_counts() -> dict[int, int]:
    """Keys owned per sandbox uid (/proc/key-users: "uid: usage nkeys/nikeys ...")."""
    counts = {}
    for line in Path("/proc/key-users").read_text().splitlines():
        uid, rest = line.split(":", 1)
        if int(uid) in SANDBOX_UIDS:
            counts[int(uid)] = int(rest.split()[1].split("/")[0])
    return counts


@pytest.fixture(scope="module", autouse=True)
def key_baseline():
    """The sandbox uids' key counts before this module's first attack (a uid's own keyrings outlive it)."""
    return _key_counts()


def _new_keys(baseline: dict[int, int]) -> list[int]:
    """Sandbox uids owning more keys than before the suite; their user keyrings are invalidated."""
    found = [uid for uid, n in _key_counts().items() if n > baseline.get(uid, 0)]
    for uid in found:
        pid = os.fork()
        if pid == 0:
            try:
                os.setresuid(uid, uid, uid)
                libc = ctypes.CDLL(None)
                libc.syscall(250, 21, libc.syscall(250, 0, -4, 0))  # KEYCTL_INVALIDATE the user keyring
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
    return found


def _sandbox_processes() -> list[int]:
    return sandbox_processes(SANDBOX_UIDS)


def _sandbox_listeners() -> list[str]:
    out = []
    for name in ("tcp", "tcp6", "udp", "udp6"):
        path = Path(f"/proc/net/{name}")
        if path.exists():
            for line in path.read_text().splitlines()[1:]:
                fields = line.split()
                if int(fields[7]) in SANDBOX_UIDS:
                    out.append(f"{name} {fields[1]}")
    return out


def _attack_files() -> list[str]:
    """Files the red-team attacks left in the host's world-writable directories (their names carry
    "grpolab-rt-"), and in / (each directory once, links resolved)."""
    out = subprocess.run(
        ["find", "/", "-xdev", "-type", "d", "-perm", "-0002"], capture_output=True, text=True, timeout=60
    ).stdout.split()
    found = []
    for d in sorted({os.path.realpath(d) for d in out + ["/"] if not d.startswith(("/tmp/", "/var/tmp/"))}):
        try:
            found += [os.path.join(d, n) for n in os.listdir(d) if "grpolab-rt-" in n]
        except OSError:
            pass
    return found


def test_zz_nothing_left_on_the_host_and_normal_programs_score_right(key_baseline):
    """After every attack above: no file of the suite outside the sandbox's own directories, no SysV object, no
    POSIX message queue, no key, no process and no socket of a sandbox uid, no working directory left; and a
    batch of normal programs scores exactly."""
    files = _attack_files()
    for path in files:
        os.remove(path)
    sysv = _sysv_leftovers()
    _remove_sysv(sysv)
    left = {
        "files": files,
        "sysv": sysv,
        "mqueue": _mqueue_left(),
        "keys": _new_keys(key_baseline),
        "processes": _sandbox_processes(),
        "sockets": _sandbox_listeners(),
        "workdirs": sandbox_workdirs(SANDBOX_UIDS),
    }
    assert left == {
        "files": [],
        "sysv": [],
        "mqueue": False,
        "keys": [],
        "processes": [],
        "sockets": [],
        "workdirs": {},
    }
    assert_normal_programs_score_exactly(LIMITS)
