"""The fourth red-team pass on the code judge (issue 61): the system-call allow-list, the channels between samples
that run at the same time, the scratch mounted noexec, every inherited descriptor closed, and a trainer holding
more than 1024 descriptors.

1. host-global counters (``sysinfo``: the thread count and free / shared memory a program modulated to copy
   answers from a concurrent sample; ``sysconf`` reads them through it);
2. lasting or host-wide costs: ``memfd_secret`` (the kernel's direct map split for good), ``sync`` / ``syncfs`` /
   ``sync_file_range`` (another process's dirty data flushed), ``vmsplice`` / ``splice`` (huge pages pinned in a
   pipe), ``mlock``, ``userfaultfd``;
3. calls no program needs, each simply refused: perf_event_open, io_uring_setup, the keyring, mount, unshare, setns,
   personality, kexec_load, reboot, ptrace, bpf, mincore, sched_setaffinity, inotify, prctl(PR_SET_MM);
4. running code the program wrote: exec of a scratch file, an executable mapping of one, the scratch's mount flags;
5. descriptors: one inherited above 4096, and a trainer with 1100 open files (the judge used to wait with select);
6. CPU time as a carrier between concurrent samples: each slot's run is pinned to a CPU of its own.

Every refused call must fail with ENOSYS (the filter's answer; the old deny list gave EACCES, or let the call
through). Bounded: 3 s wall, 2 s CPU, 256 MiB, 8 processes per program; every attack is harmless even where it
is let through (a flush, a 4 KiB lock, a file descriptor, calls with arguments the kernel rejects)."""

from __future__ import annotations

import errno
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from grpolab.sandbox import Job, SandboxLimits, SandboxPool, detect, run_job, runner, seccomp
from grpolab.sandbox.confine import close_inherited

LIMITS = SandboxLimits(
    wall_s=3.0, cpu_s=2.0, memory_mb=256, max_procs=8, max_file_mb=8, disk_mb=16, max_output_kb=64, workers=2, uid=63200
)
MACHINE = os.uname().machine
ENOSYS = errno.ENOSYS

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="the hostile suite checks the uid drop: run as root"),
    pytest.mark.skipif(MACHINE not in seccomp.AUDIT, reason="no syscall table for this machine"),
]


def nr(name: str) -> int:
    return seccomp.number(name, MACHINE) if MACHINE in seccomp.AUDIT else -1


# a raw system call from the program: its errno when it failed, else "ok"
RAW = (
    "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nlibc.syscall.restype = ctypes.c_long\n"
    "def _raw(number, *args):\n"
    "    ctypes.set_errno(0)\n"
    "    ret = libc.syscall(number, *[ctypes.c_long(a) if isinstance(a, int) else a for a in args])\n"
    "    if ret == -1:\n        return ctypes.get_errno()\n"
    "    if number in FDS and ret >= 0:\n        os.close(ret)\n"
    "    return 'ok'\n"
)


@dataclass(frozen=True)
class Attack:
    """A program whose ``f()`` reports what the kernel answered, and the test it must pass."""

    program: str
    case: str = f"assert f() == {ENOSYS}"
    detail_has: str = ""  # text the (failing) case's detail must show


def _refused(name: str, *args: object, fds: bool = False) -> Attack:
    """``f()`` makes the raw call `name` with `args` (harmless ones: where the call is let through it creates a
    descriptor, closed at once, or the kernel rejects the arguments); it must fail with ENOSYS."""
    rendered = ", ".join(repr(a) if not isinstance(a, str) else a for a in args)
    head = RAW.replace("FDS", f"({nr(name)},)" if fds else "()")
    return Attack(head + f"def f():\n    return _raw({nr(name)}{', ' if args else ''}{rendered})\n")


def _host_counters() -> dict[str, Attack]:
    """Class 1: no host-wide counter reaches the program (the judge, unfiltered, is the host's view)."""
    phys = os.sysconf("SC_PHYS_PAGES")
    buf = "ctypes.create_string_buffer(256)"
    return {
        "sysinfo_raw": _refused("sysinfo", buf),
        "sysinfo_libc": Attack(
            RAW.replace("FDS", "()") + "def f():\n    ctypes.set_errno(0)\n"
            "    ret = libc.sysinfo(ctypes.create_string_buffer(256))\n    return ctypes.get_errno() if ret else 'ok'\n"
        ),
        "sysconf_phys_pages_not_the_hosts": Attack(
            "import os\ndef f():\n    return os.sysconf('SC_PHYS_PAGES')\n", f"assert f() != {phys}"
        ),
        "sysinfo_thread_count_moves_with_threads": Attack(
            RAW.replace("FDS", "()") + "import threading, time\n"
            "def _procs():\n    buf = ctypes.create_string_buffer(256)\n"
            "    if libc.sysinfo(buf) != 0:\n        return None\n"
            "    return int.from_bytes(buf.raw[80:82], 'little')\n"  # struct sysinfo.procs (x86_64, aarch64)
            "def f():\n    before = _procs()\n"
            "    for _ in range(3):\n        threading.Thread(target=time.sleep, args=(0.3,), daemon=True).start()\n"
            "    after = _procs()\n    return 'refused' if before is None and after is None else after - before\n",
            "assert f() == 'refused'",
        ),
        "no_proc_loadavg_or_meminfo": Attack(
            "import os\ndef f():\n    return [os.path.exists(p) for p in ('/proc/loadavg', '/proc/meminfo', '/sys')]\n",
            "assert f() == [False, False, False]",
        ),
    }


def _host_costs() -> dict[str, Attack]:
    """Class 2: calls that cost the host beyond every limit, or for good."""
    # a pipe is refused too now (its inode number is a host-wide counter): f() answers ENOSYS from os.pipe then
    pipe = "    try:\n        r, w = os.pipe()\n    except OSError as e:\n        return e.errno\n"
    vmsplice = (
        RAW.replace("FDS", "()") + "class Iov(ctypes.Structure):\n"
        "    _fields_ = [('base', ctypes.c_void_p), ('len', ctypes.c_size_t)]\n"
        "BUF = ctypes.create_string_buffer(b'x', 4096)\n"
        f"def f():\n{pipe}    iov = Iov(ctypes.addressof(BUF), 1)\n"
        f"    return _raw({nr('vmsplice')}, w, ctypes.byref(iov), 1, 0)\n"
    )
    splice = (
        RAW.replace("FDS", "()") + "def f():\n    open('src', 'wb').write(b'x' * 4096)\n"
        f"    fd = os.open('src', os.O_RDONLY)\n{pipe}"
        f"    return _raw({nr('splice')}, fd, 0, w, 0, 4096, 0)\n"
    )
    scratch_fd = "os.open('.', os.O_RDONLY)"
    return {
        "memfd_secret": _refused("memfd_secret", 0, fds=True),
        "sync": _refused("sync"),
        "syncfs": _refused("syncfs", scratch_fd),
        "sync_file_range": Attack(
            RAW.replace("FDS", "()") + "def f():\n    fd = os.open('x', os.O_CREAT | os.O_WRONLY)\n"
            f"    os.write(fd, b'x')\n    return _raw({nr('sync_file_range')}, fd, 0, 0, 2)\n"
        ),
        "vmsplice_one_byte_pins_nothing": Attack(vmsplice),
        "splice": Attack(splice),
        "tee": Attack(RAW.replace("FDS", "()") + f"def f():\n{pipe}    return _raw({nr('tee')}, r, w, 1, 0)\n"),
        "pipe_inode_counter": Attack(RAW.replace("FDS", "()") + f"def f():\n{pipe}    return 'a pipe'\n"),
        "mlock": Attack(
            RAW.replace("FDS", "()") + "BUF = ctypes.create_string_buffer(4096)\n"
            f"def f():\n    return _raw({nr('mlock')}, ctypes.addressof(BUF), 4096)\n"
        ),
        "userfaultfd_user_mode": _refused("userfaultfd", 1, fds=True),
    }


def _not_on_the_list() -> dict[str, Attack]:
    """Class 3: calls no CPython program needs; harmless arguments (the kernel would reject them anyway)."""
    return {
        "perf_event_open": _refused("perf_event_open", 0, 0, -1, -1, 0),
        "io_uring_setup": _refused("io_uring_setup", 1, 0),
        "add_key": _refused("add_key", 0, 0, 0, 0, 0),
        "keyctl_session_keyring": _refused("keyctl", 0, -3, 0),
        "mount": _refused("mount", 0, 0, 0, 0, 0),
        "unshare_nothing": _refused("unshare", 0),
        "setns": _refused("setns", -1, 0),
        "personality_query": _refused("personality", 0xFFFFFFFF),
        "kexec_load": _refused("kexec_load", 0, 0, 0, 0),
        "reboot_bad_magic": _refused("reboot", 0, 0, 0, 0),
        "ptrace_attach_judge": _refused("ptrace", 16, "os.getppid()", 0, 0),
        "bpf": _refused("bpf", -1, 0, 0),
        "mincore": Attack(
            RAW.replace("FDS", "()") + "import mmap\nM = mmap.mmap(-1, 4096)\nV = ctypes.create_string_buffer(1)\n"
            "def f():\n    addr = ctypes.addressof(ctypes.c_char.from_buffer(M))\n"
            f"    return _raw({nr('mincore')}, addr, 4096, V)\n"
        ),
        "sched_setaffinity": Attack(
            RAW.replace("FDS", "()") + "M = ctypes.c_ulong(1)\n"
            f"def f():\n    return _raw({nr('sched_setaffinity')}, 0, 8, ctypes.byref(M))\n"
        ),
        "inotify": _refused("inotify_init1", 0, fds=True),
        "prctl_set_mm": Attack(
            RAW.replace("FDS", "()") + f"def f():\n    return _raw({nr('prctl')}, 35, 0, 0, 0, 0)\n",
            f"assert f() == {errno.EINVAL}",
        ),
        "refused_at_load_time_with_a_clear_detail": Attack(
            "import socket\nsocket.socket()\ndef f():\n    return 1\n",
            "assert f() == 1",
            detail_has="outside the sandbox's allow-list",
        ),
        "socket_refused_with_a_clear_detail": Attack(
            "import socket\ndef f():\n    return socket.socket()\n",
            "assert f() is not None",
            detail_has="outside the sandbox's allow-list",
        ),
    }


def _running_written_code() -> dict[str, Attack]:
    """Class 4: nothing the program writes can run as code."""
    flags = "os.ST_NOEXEC | os.ST_NOSUID | os.ST_NODEV"
    return {
        "exec_of_a_scratch_file": Attack(
            "import os\ndef f():\n    open('run', 'w').write('#!/sandbox/run\\n')\n    os.chmod('run', 0o755)\n"
            "    try:\n        os.execv('/sandbox/run', ['run'])\n"
            "    except OSError as exc:\n        return exc.errno\n"
        ),
        "executable_mapping_of_a_scratch_file": Attack(
            "import mmap, os\ndef f():\n    open('/tmp/code', 'wb').write(b'\\xc3' * 4096)\n"
            "    fd = os.open('/tmp/code', os.O_RDONLY)\n    try:\n"
            "        mmap.mmap(fd, 4096, prot=mmap.PROT_READ | mmap.PROT_EXEC)\n        return 'mapped'\n"
            "    except OSError as exc:\n        return exc.errno\n",
            f"assert f() == {errno.EPERM}",
        ),
        "scratch_mounts_noexec_nosuid_nodev": Attack(
            f"import os\ndef f():\n    return [os.statvfs(p).f_flag & ({flags}) == ({flags})"
            " for p in ('/sandbox', '/tmp', '/var/tmp', '/dev/shm')]\n",
            "assert f() == [True, True, True, True]",
        ),
    }


def _still_works() -> dict[str, Attack]:
    """Neighbours that must keep working: what CPython programs use (threads, fork, files, copies, sleep)."""
    program = (
        "import os, shutil, tempfile, threading, time, hashlib, random, json, fractions\n"
        "def f():\n    out = []\n    t = threading.Thread(target=lambda: out.append(sum(range(10))))\n"
        "    t.start()\n    t.join()\n    pid = os.fork()\n    if pid == 0:\n        os._exit(3)\n"
        "    out.append(os.waitpid(pid, 0)[1] >> 8)\n    d = tempfile.mkdtemp()\n"
        "    open(d + '/a', 'w').write('hi')\n    shutil.copy(d + '/a', d + '/b')\n"
        "    fd = os.open(d + '/b', os.O_RDONLY)\n    os.fsync(fd)\n    os.close(fd)\n"
        "    out.append(open(d + '/b').read())\n    time.sleep(0.01)\n    random.seed(1)\n"
        "    out.append(len(hashlib.sha256(b'x').hexdigest()))\n    return out\n"
    )
    return {"threads_fork_files_copy_sleep": Attack(program, "assert f() == [45, 3, 'hi', 64]")}


def _fifth_pass() -> dict[str, Attack]:
    """The red team's pass on the allow-list: a shared futex keyed on libc's pages (two runs mapping the same file
    woke each other, about 10 kbit/s, and a program copied a concurrent sample's answer), and the judge's CPU clock
    read through a negative clock id. Threads, events and pools, which use private futexes, keep working."""
    futex = (
        RAW.replace("FDS", "()") + "import time\n"
        "class TS(ctypes.Structure):\n    _fields_ = [('s', ctypes.c_long), ('ns', ctypes.c_long)]\n"
        "def f():\n    a = (ctypes.cast(libc.getpid, ctypes.c_void_p).value + 64) & ~3\n"
        "    value = ctypes.c_uint32.from_address(a).value\n    start = time.monotonic()\n"
        f"    waited = _raw({nr('futex')}, ctypes.c_void_p(a), 0, value, ctypes.byref(TS(1, 0)), None, 0)\n"
        f"    woke = _raw({nr('futex')}, ctypes.c_void_p(a), 1, 1, None, None, 0)\n"
        "    return waited, woke, time.monotonic() - start < 0.5\n"
    )
    pools = (
        "import threading, concurrent.futures\n"
        "def f():\n    ev, out = threading.Event(), []\n"
        "    t = threading.Thread(target=lambda: (ev.wait(2), out.append(1)))\n    t.start()\n    ev.set()\n"
        "    t.join(2)\n    with concurrent.futures.ThreadPoolExecutor(2) as ex:\n"
        "        out.append(sum(ex.map(lambda x: x * x, range(10))))\n    return out\n"
    )
    clock = (
        "import time\ndef f():\n    try:\n        time.clock_gettime_ns(((~1) << 3) | 2)\n"
        "    except OSError as e:\n        return e.errno\n    return 'read the judge CPU time'\n"
    )
    return {
        "shared_futex_on_libc_sleeps_and_wakes_nobody": Attack(
            futex, f"assert f() == ({errno.EAGAIN}, {errno.EINVAL}, True)"
        ),
        "threads_events_and_pools_still_work": Attack(pools, "assert f() == [1, 285]"),
        "judges_cpu_clock": Attack(clock, f"assert f() == {errno.EINVAL}"),
        "own_cpu_clocks_still_read": Attack(
            "import time\ndef f():\n    return time.process_time() >= 0 and time.thread_time() >= 0\n",
            "assert f() is True",
        ),
    }


ATTACKS = {
    **_host_counters(),
    **_host_costs(),
    **_not_on_the_list(),
    **_running_written_code(),
    **_still_works(),
    **_fifth_pass(),
}


@pytest.fixture(scope="module")
def batch():
    """Every attack in one pool of two slots (as a GRPO group's samples run), with normal programs around them."""
    pool = SandboxPool(LIMITS)
    names = list(ATTACKS)
    jobs = [Job(ATTACKS[n].program, (ATTACKS[n].case,), entry_points=("f",)) for n in names]
    results = dict(zip(names, pool.run_many(jobs)))
    pool.close()
    return results


@pytest.mark.parametrize("name", list(ATTACKS))
def test_attack_is_refused(batch, name):
    """Each call is refused the way the filter or the mount says (ENOSYS, EPERM, EINVAL), never an invalid
    sample; a refusal that raises says so in the detail."""
    attack, result = ATTACKS[name], batch[name]
    assert result.infra_error is None, result.infra_error
    if attack.detail_has:
        assert not result.all_passed and attack.detail_has in result.cases[0].detail, result.cases
    else:
        assert result.all_passed, (result.cases, result.stdout[-300:], result.stderr[-300:])


# ----------------------------------------------------------------------------------------------- the filter itself


def run_filter(insns: list[tuple[int, int, int, int]], arch: int, number: int, args: tuple[int, ...] = ()) -> int:
    """Classic BPF as the kernel runs a seccomp filter (the subset ``seccomp.program`` emits): the return value for
    one call. seccomp_data: nr at 0, arch at 4, args[i] at 16 + 8 i (little-endian, low word first)."""
    words = {0: number, 4: arch}
    for i, a in enumerate((*args, 0, 0, 0, 0, 0, 0)[:6]):
        words[16 + 8 * i], words[20 + 8 * i] = a & 0xFFFFFFFF, a >> 32
    acc, pc = 0, 0
    for _ in range(len(insns) + 1):
        code, jt, jf, k = insns[pc]
        if code == 0x20:
            acc, pc = words[k], pc + 1
        elif code == 0x06:
            return k
        elif code == 0x54:
            acc, pc = acc & k, pc + 1
        else:
            taken = {0x15: acc == k, 0x35: acc >= k, 0x45: bool(acc & k)}[code]
            pc += 1 + (jt if taken else jf)
    raise AssertionError("the filter does not end")


MACHINES = ("x86_64", "aarch64")
ALLOW, NOSYS = seccomp.RET_ALLOW, seccomp.RET_ERRNO | ENOSYS


@pytest.mark.parametrize("machine", MACHINES)
def test_filter_allows_exactly_the_list(machine):
    """Every listed call is allowed, every refused one and every number not on the list fails with ENOSYS."""
    insns = seccomp.program(machine)
    audit = seccomp.AUDIT[machine]
    allowed = set(seccomp.allowed_numbers(machine))
    for n in allowed:
        assert run_filter(insns, audit, n) == ALLOW, n
    for name in seccomp.REFUSED:
        if seccomp.number(name, machine) is not None:
            assert run_filter(insns, audit, seccomp.number(name, machine)) == NOSYS, name
    unlisted = [
        n
        for n in range(600)
        if n not in allowed and n not in {seccomp.number(c, machine) for c in seccomp.ARGUMENT_CHECKED}
    ]
    assert all(run_filter(insns, audit, n) == NOSYS for n in unlisted)
    assert not {n for names in seccomp.ALLOWED.values() for n in names} & set(seccomp.REFUSED)


@pytest.mark.parametrize("machine", MACHINES)
def test_filter_checks_the_architecture_and_x32(machine):
    """A call through another ABI (i386's int 0x80: another audit value; x32: the 0x40000000 bit) is refused
    before any number is compared, even one whose number means read or write natively."""
    insns = seccomp.program(machine)
    for other in (0x40000003, 0xC00000B7 if machine == "x86_64" else 0xC000003E, 0):  # i386, the other, none
        assert run_filter(insns, other, seccomp.number("read", machine)) == NOSYS
    if machine == "x86_64":
        assert run_filter(insns, seccomp.AUDIT[machine], seccomp.X32_BIT | 0) == NOSYS


@pytest.mark.parametrize("machine", MACHINES)
def test_filter_checks_clone_flags_and_prctl_options(machine):
    """clone: threads and fork allowed, any CLONE_NEW* flag EPERM (the low word of args[0]); prctl: only the
    listed options (PR_SET_DUMPABLE and PR_SET_MM among the refused: EINVAL)."""
    insns, audit = seccomp.program(machine), seccomp.AUDIT[machine]
    clone, prctl = seccomp.number("clone", machine), seccomp.number("prctl", machine)
    thread_flags, fork_flags = 0x3D0F00, 0x1200011
    assert run_filter(insns, audit, clone, (thread_flags,)) == ALLOW
    assert run_filter(insns, audit, clone, (fork_flags,)) == ALLOW
    for flag in (0x20000, 0x2000000, 0x4000000, 0x8000000, 0x10000000, 0x20000000, 0x40000000):
        assert run_filter(insns, audit, clone, (fork_flags | flag,)) == seccomp.RET_ERRNO | errno.EPERM, hex(flag)
    for option in seccomp.PRCTL_OPTIONS:
        assert run_filter(insns, audit, prctl, (option,)) == ALLOW
    for option in (4, 22, 35, 0x59616D61):  # SET_DUMPABLE, SET_SECCOMP, SET_MM, SET_PTRACER
        assert run_filter(insns, audit, prctl, (option,)) == seccomp.RET_ERRNO | errno.EINVAL


@pytest.mark.parametrize("machine", MACHINES)
def test_filter_checks_futex_clone_pidfd_and_clock_ids(machine):
    """futex: private operations allowed, a shared wait EAGAIN at once, any other shared operation EINVAL; clone with
    CLONE_PIDFD EPERM (a pidfd's inode is a host-wide task counter); a negative clock id (another process's CPU
    clock) EINVAL for the three clock calls, the ordinary clocks allowed; pipes refused."""
    insns, audit = seccomp.program(machine), seccomp.AUDIT[machine]
    futex, clone = seccomp.number("futex", machine), seccomp.number("clone", machine)
    eagain, einval = seccomp.RET_ERRNO | errno.EAGAIN, seccomp.RET_ERRNO | errno.EINVAL
    for op in (128, 129, 128 | 9, 128 | 10, 128 | 256 | 9):  # WAIT, WAKE, WAIT_BITSET, WAKE_BITSET, realtime clock
        assert run_filter(insns, audit, futex, (0x7F00, op)) == ALLOW, op
    for op in (0, 9, 256 | 9):
        assert run_filter(insns, audit, futex, (0x7F00, op)) == eagain, op
    for op in (1, 10, 5, 6):  # WAKE, WAKE_BITSET, WAKE_OP, LOCK_PI
        assert run_filter(insns, audit, futex, (0x7F00, op)) == einval, op
    assert run_filter(insns, audit, clone, (0x1200011 | 0x1000,)) == seccomp.RET_ERRNO | errno.EPERM
    for name in seccomp.CLOCK_CALLS:
        call = seccomp.number(name, machine)
        for clock in (0, 1, 2, 3, 4, 7):
            assert run_filter(insns, audit, call, (clock,)) == ALLOW, (name, clock)
        for clock in (((~1) << 3) | 2, -6, -1):
            assert run_filter(insns, audit, call, (clock,)) == einval, (name, clock)
    for name in ("pipe", "pipe2"):
        if seccomp.number(name, machine) is not None:
            assert run_filter(insns, audit, seccomp.number(name, machine)) == NOSYS


HEADERS = {
    "x86_64": Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h"),
    "aarch64": Path("/usr/include/asm-generic/unistd.h"),
}
# the generic table's names for the 64-bit forms (__NR3264_*)
GENERIC_64 = {"fstatat": "newfstatat", "fadvise64_64": "fadvise64"}


@pytest.mark.parametrize("machine", MACHINES)
def test_table_matches_the_kernel_headers(machine):
    """The numbers in seccomp.TABLE are the kernel's (read from this machine's headers where installed)."""
    header = HEADERS[machine]
    if not header.is_file():
        pytest.skip(f"no {header} here")
    found = {}
    for name, value in re.findall(r"#define __NR(?:3264)?_(\w+)\s+(\d+)", header.read_text()):
        found[GENERIC_64.get(name, name)] = int(value)
    for name, numbers in seccomp.TABLE.items():
        expected = numbers[MACHINES.index(machine)]
        assert found.get(name) == expected, (name, found.get(name), expected)


# ----------------------------------------------------------------------------------------------- descriptors


def test_close_inherited_closes_descriptors_above_4096():
    """The worker's close: a descriptor numbered 5000 and one at the top of this process's range are closed, the
    kept ones are not (run in a forked child, which reports by its exit status)."""
    soft, hard = __import__("resource").getrlimit(__import__("resource").RLIMIT_NOFILE)
    if hard < 5001:
        pytest.skip("RLIMIT_NOFILE too low for a descriptor above 4096")
    pid = os.fork()
    if pid == 0:
        try:
            import resource

            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            fd = os.open(os.devnull, os.O_RDONLY)
            os.dup2(fd, 5000)
            os.dup2(fd, hard - 1)
            close_inherited({1, 2, fd})
            alive = [_is_open(n) for n in (fd, 5000, hard - 1, 0, 3 if fd != 3 else 4)]
            os._exit(0 if alive == [True, False, False, False, False] else 1)
        except BaseException:
            os._exit(2)
    assert os.waitpid(pid, 0)[1] >> 8 == 0


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False


def test_inherited_high_descriptor_is_not_visible(monkeypatch):
    """A descriptor above 4096 handed to the judge (as a wrapper around the trainer might) never reaches the
    program: it is closed before any code of the program runs."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < 5001:
        pytest.skip("RLIMIT_NOFILE too low for a descriptor above 4096")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 5001), hard))
    fd = os.open(os.devnull, os.O_RDONLY)
    os.dup2(fd, 5000)
    real = subprocess.Popen

    def popen(*args, **kwargs):
        kwargs["pass_fds"] = tuple(kwargs.get("pass_fds", ())) + (5000,)
        return real(*args, **kwargs)

    monkeypatch.setattr(runner.subprocess, "Popen", popen)
    program = (
        "import os\ndef f():\n    try:\n        os.fstat(5000)\n        return 'open'\n"
        "    except OSError:\n        return 'closed'\n"
    )
    try:
        result = run_job(Job(program, ("assert f() == 'closed'",), entry_points=("f",)), LIMITS, detect(LIMITS), 11)
    finally:
        os.close(5000)
        os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert result.infra_error is None and result.all_passed, result.cases


def test_trainer_with_1100_open_files_still_scores():
    """A trainer holding 1100 descriptors: the result pipe's number is above 1024 in the judge, which select()
    cannot watch (every sample was invalid); with poll a right and a wrong program score 1 and 0."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < 1300:
        pytest.skip("RLIMIT_NOFILE too low")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1300), hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        iso = detect(LIMITS)
        right = run_job(Job("def f(x):\n    return x * x\n", ("assert f(3) == 9",)), LIMITS, iso, 12)
        wrong = run_job(Job("def f(x):\n    return x + x\n", ("assert f(3) == 9",)), LIMITS, iso, 12)
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert right.infra_error is None and right.all_passed, (right.infra_error, right.cases)
    assert wrong.infra_error is None and [c.reason for c in wrong.cases] == ["wrong_answer"], wrong.cases


def test_each_slot_runs_pinned_to_its_own_cpu():
    """Slot i's run is pinned to the i-th CPU this process may use (so two slots never share a CPU, and a busy
    program cannot slow its neighbour), and the program cannot move itself."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("one CPU: nothing to pin apart")
    program = (
        "import os\ndef f():\n    try:\n        os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))\n"
        "    except OSError:\n        pass\n    return sorted(os.sched_getaffinity(0))\n"
    )
    iso = detect(LIMITS)
    for slot in (0, 1):
        case = f"assert f() == [{cpus[slot % len(cpus)]}]"
        result = run_job(Job(program, (case,), entry_points=("f",)), LIMITS, iso, slot)
        assert result.infra_error is None and result.all_passed, (slot, result.cases)


def test_setups_without_a_mount_namespace_say_the_scratch_is_not_noexec():
    """Where there is no mount namespace the working directory is a host directory: the start-up warning says it
    is not noexec and that /proc's host-wide counters are readable (docs/code.md "Fallbacks")."""
    from grpolab.sandbox.isolation import candidates

    for candidate in candidates("/usr/bin/unshare", True, True):
        text = " ".join(candidate.missing())
        assert ("not mounted noexec" in text) == (not candidate.mounts), candidate.name
        assert ("host-wide counters" in text) == (not candidate.mounts), candidate.name
