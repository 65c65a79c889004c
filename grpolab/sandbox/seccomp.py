"""The worker's system-call filter: an allow-list, default deny, the architecture checked (standard library only;
loaded by the judge with harness.py and confine.py; docs/code.md "The system-call allow-list").

Why an allow-list: each red-team pass found a call the deny list had not named (``memfd_secret`` splitting the
kernel's direct map for good, ``sync`` forcing the host's I/O, ``vmsplice`` pinning huge pages in a pipe,
``sysinfo`` reading host-wide counters two samples used to talk). A call that nobody listed now fails.

How the list was derived: the worker's system calls after the filter is installed, traced with ``strace -f`` over
HumanEval's 164 canonical solutions and MBPP's 974 reference programs run through the reward (pyfunc has no
reference programs). They need only read, write, pselect6 (now poll), openat, close, lseek, newfstatat,
getdents64, ioctl, mmap, munmap, mprotect, mremap, brk and exit_group: imports from the run's private copies and
the judge's pipes. Then what CPython and the C library need for the rest of the standard library a program may
use: threads (clone without namespace flags, futex, rseq, set_robust_list), fork and wait, signals and timers,
sleeping, files and directories in the scratch tmpfs, the clocks, rlimits, randomness (``ALLOWED``, by purpose).

What a refused call returns: ``ENOSYS`` ("function not implemented"), never a kill. The C library and CPython
treat ENOSYS as "this kernel lacks the call" and take their fallback (clone3 -> clone, faccessat2 -> faccessat,
sendfile -> read/write in shutil), so a harmless call the list did not foresee degrades to the older path instead
of killing the worker mid-reply (a kill would make a plain program score 0 for a probe of the C library's). A
Python-level refusal surfaces in the sample's detail as "OSError ENOSYS: ... a system call outside the sandbox's
allow-list" (harness.classify). Some calls are allowed with their arguments checked (ARGUMENT_CHECKED): ``clone``
with any CLONE_NEW* flag or CLONE_PIDFD fails with EPERM (new namespaces; a pidfd's inode is a host-wide task
counter), ``prctl`` accepts only the options in PRCTL_OPTIONS (EINVAL otherwise: dumping cannot be re-enabled,
PR_SET_MM cannot rewrite the process's memory map), ``futex`` only private operations (``program`` says why), the
clock calls only clock ids >= 0 (a negative one reads another process's CPU clock, the judge's). A call made through another
ABI (i386 ``int 0x80``, x32 numbers) fails before any number is compared: the numbers below are those of the
machine's native ABI only.
"""

from __future__ import annotations

import ctypes
import errno
import os

# name: (x86_64, aarch64); None where the call does not exist on that machine (aarch64 has only the *at forms).
# From the kernel's tables (arch/x86/entry/syscalls/syscall_64.tbl, include/uapi/asm-generic/unistd.h).
TABLE: dict[str, tuple[int | None, int | None]] = {
    # memory
    "brk": (12, 214), "mmap": (9, 222), "munmap": (11, 215), "mprotect": (10, 226), "mremap": (25, 216),
    "madvise": (28, 233), "msync": (26, 227),
    # files and descriptors
    "read": (0, 63), "write": (1, 64), "readv": (19, 65), "writev": (20, 66), "pread64": (17, 67),
    "pwrite64": (18, 68), "preadv": (295, 69), "pwritev": (296, 70), "preadv2": (327, 286), "pwritev2": (328, 287),
    "lseek": (8, 62), "openat": (257, 56), "open": (2, None), "creat": (85, None), "close": (3, 57),
    "close_range": (436, 436), "fstat": (5, 80), "stat": (4, None), "lstat": (6, None), "newfstatat": (262, 79),
    "statx": (332, 291), "fstatfs": (138, 44), "statfs": (137, 43), "getdents64": (217, 61), "access": (21, None),
    "faccessat": (269, 48), "faccessat2": (439, 439), "readlink": (89, None), "readlinkat": (267, 78),
    "getcwd": (79, 17), "chdir": (80, 49), "fchdir": (81, 50), "mkdir": (83, None), "mkdirat": (258, 34),
    "rmdir": (84, None), "unlink": (87, None), "unlinkat": (263, 35), "rename": (82, None), "renameat": (264, 38),
    "renameat2": (316, 276), "link": (86, None), "linkat": (265, 37), "symlink": (88, None),
    "symlinkat": (266, 36), "chmod": (90, None), "fchmod": (91, 52), "fchmodat": (268, 53), "truncate": (76, 45),
    "ftruncate": (77, 46), "fsync": (74, 82), "fdatasync": (75, 83), "utimensat": (280, 88), "umask": (95, 166),
    "flock": (73, 32), "fcntl": (72, 25), "dup": (32, 23), "dup2": (33, None), "dup3": (292, 24),
    "pipe": (22, None), "pipe2": (293, 59), "ioctl": (16, 29),
    # waiting and sleeping
    "select": (23, None), "pselect6": (270, 72), "poll": (7, None), "ppoll": (271, 73),
    "epoll_create": (213, None), "epoll_create1": (291, 20), "epoll_ctl": (233, 21), "epoll_wait": (232, None),
    "epoll_pwait": (281, 22), "nanosleep": (35, 101), "clock_nanosleep": (230, 115), "sched_yield": (24, 124),
    "futex": (202, 98),
    # clocks and accounting of this process
    "clock_gettime": (228, 113), "clock_getres": (229, 114), "gettimeofday": (96, 169), "time": (201, None),
    "times": (100, 153), "getrusage": (98, 165), "alarm": (37, None), "setitimer": (38, 103),
    "getitimer": (36, 102),
    # processes, identities, limits
    "fork": (57, None), "vfork": (58, None), "wait4": (61, 260), "waitid": (247, 95), "exit": (60, 93),
    "exit_group": (231, 94), "kill": (62, 129), "tgkill": (234, 131), "tkill": (200, 130), "getpid": (39, 172),
    "getppid": (110, 173), "gettid": (186, 178), "getpgrp": (111, None), "getpgid": (121, 155),
    "getsid": (124, 156), "setsid": (112, 157), "setpgid": (109, 154), "set_tid_address": (218, 96),
    "set_robust_list": (273, 99), "rseq": (334, 293), "sched_getaffinity": (204, 123), "getpriority": (140, 141),
    "prlimit64": (302, 261), "getrlimit": (97, 163), "setrlimit": (160, 164), "uname": (63, 160),
    "getuid": (102, 174), "geteuid": (107, 175), "getgid": (104, 176), "getegid": (108, 177),
    "getgroups": (115, 158), "getresuid": (118, 148), "getresgid": (120, 150), "getrandom": (318, 278),
    # signals
    "rt_sigaction": (13, 134), "rt_sigprocmask": (14, 135), "rt_sigreturn": (15, 139), "rt_sigpending": (127, 136),
    "rt_sigtimedwait": (128, 137), "rt_sigsuspend": (130, 133), "sigaltstack": (131, 132), "pause": (34, None),
    # allowed with their arguments checked
    "clone": (56, 220), "prctl": (157, 167),
    # never allowed; named for the tests, the docs and confine (pivot_root, before the filter)
    "clone3": (435, 435), "sysinfo": (99, 179), "memfd_secret": (447, 447), "memfd_create": (319, 279),
    "sync": (162, 81), "syncfs": (306, 267), "sync_file_range": (277, 84), "vmsplice": (278, 75),
    "splice": (275, 76), "tee": (276, 77), "sendfile": (40, 71), "copy_file_range": (326, 285),
    "unshare": (272, 97), "setns": (308, 268), "ptrace": (101, 117), "perf_event_open": (298, 241),
    "bpf": (321, 280), "userfaultfd": (323, 282), "io_uring_setup": (425, 425), "add_key": (248, 217),
    "request_key": (249, 218), "keyctl": (250, 219), "mount": (165, 40), "umount2": (166, 39),
    "pivot_root": (155, 41), "personality": (135, 92), "kexec_load": (246, 104), "reboot": (169, 142),
    "socket": (41, 198), "socketpair": (53, 199), "execve": (59, 221), "execveat": (322, 281),
    "mlock": (149, 228), "mincore": (27, 232), "process_vm_readv": (310, 270), "sched_setaffinity": (203, 122),
    "setpriority": (141, 140), "fadvise64": (221, 223), "inotify_init1": (294, 26), "shmget": (29, 194),
    "msgget": (68, 186), "semget": (64, 190), "mq_open": (240, 180),
}  # fmt: skip

# The allow-list by purpose (docs/code.md lists why each group is there). Most frequent first: the filter compares
# in this order, and read / write / the wait on the judge's pipe are nearly every call a run makes.
ALLOWED: dict[str, tuple[str, ...]] = {
    "the judge's pipes": ("read", "write", "pselect6", "poll", "ppoll", "select"),
    "memory": ("mmap", "munmap", "mprotect", "brk", "mremap", "madvise", "msync"),
    "imports and files in the scratch tmpfs": (
        "openat", "close", "lseek", "newfstatat", "fstat", "getdents64", "ioctl", "fcntl", "readv", "writev",
        "pread64", "pwrite64", "preadv", "pwritev", "preadv2", "pwritev2", "open", "creat", "close_range", "stat",
        "lstat", "statx", "fstatfs", "statfs", "access", "faccessat", "faccessat2", "readlink", "readlinkat",
        "getcwd", "chdir", "fchdir", "mkdir", "mkdirat", "rmdir", "unlink", "unlinkat", "rename", "renameat",
        "renameat2", "link", "linkat", "symlink", "symlinkat", "chmod", "fchmod", "fchmodat", "truncate",
        "ftruncate", "fsync", "fdatasync", "utimensat", "umask", "flock", "dup", "dup2", "dup3",
    ),
    "threads, waiting and sleeping": (
        "futex", "clone", "set_robust_list", "rseq", "sched_yield", "nanosleep", "clock_nanosleep", "epoll_create",
        "epoll_create1", "epoll_ctl", "epoll_wait", "epoll_pwait", "exit",
    ),
    "clocks and this process's accounting": (
        "clock_gettime", "clock_getres", "gettimeofday", "time", "times", "getrusage", "alarm", "setitimer",
        "getitimer",
    ),
    "processes, identities, limits": (
        "exit_group", "fork", "vfork", "wait4", "waitid", "kill", "tgkill", "tkill", "getpid", "getppid", "gettid",
        "getpgrp", "getpgid", "getsid", "setsid", "setpgid", "set_tid_address", "sched_getaffinity",
        "prlimit64", "getrlimit", "setrlimit", "uname", "getuid", "geteuid", "getgid", "getegid", "getgroups",
        "getresuid", "getresgid", "getrandom", "prctl",
    ),
    "signals": (
        "rt_sigaction", "rt_sigprocmask", "rt_sigreturn", "rt_sigpending", "rt_sigtimedwait", "rt_sigsuspend",
        "sigaltstack", "pause",
    ),
}  # fmt: skip

# Refused on purpose (not on the list, so ENOSYS like any other): each carried an attack or a cost outside every
# limit, or a neighbour of one. Checked by tests/test_sandbox_hostile4.py; never to be added to ALLOWED.
REFUSED = (
    "sysinfo",  # host-wide thread count, free and shared memory: a channel between concurrent samples
    "memfd_secret",  # splits the kernel's direct map for good
    "memfd_create",  # pages outside every rlimit
    "sync", "syncfs", "sync_file_range",  # forces the host's I/O
    "vmsplice", "splice", "tee", "sendfile", "copy_file_range",  # pages pinned or referenced from a pipe
    "mlock", "mincore", "fadvise64",  # pinning memory, reading or changing page-cache residency
    "unshare", "setns", "clone3",  # namespaces (clone3's flags are out of a filter's reach: the C library falls back)
    "ptrace", "process_vm_readv", "perf_event_open", "bpf", "userfaultfd", "io_uring_setup",
    "add_key", "request_key", "keyctl",  # the kernel keyring outlives the run
    "shmget", "msgget", "semget", "mq_open",  # IPC objects
    "mount", "umount2", "pivot_root", "personality", "kexec_load", "reboot",
    "socket", "socketpair",  # network, and files held in flight past the run
    "execve", "execveat",  # no image to run but the worker's own
    "sched_setaffinity", "setpriority",  # steering the shared CPUs (a timing channel)
    "getpriority",  # PRIO_USER searches every process of a uid host-wide, not only this PID namespace
    "inotify_init1",  # events on files another run touches
    "pipe", "pipe2",  # a new pipe's inode number comes from a host-wide counter (a channel; programs never need one)
)  # fmt: skip

AUDIT = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}  # AUDIT_ARCH_X86_64, AUDIT_ARCH_AARCH64
X32_BIT = 0x40000000  # x32 ABI numbers on x86_64 carry this bit
CLONE_NAMESPACES = 0x7E020000  # CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET
# CLONE_PIDFD: a pidfd's inode number is the kernel's host-wide count of tasks created (the sysinfo channel again)
CLONE_REFUSED = CLONE_NAMESPACES | 0x1000
FUTEX_PRIVATE_FLAG, FUTEX_CMD_MASK, FUTEX_WAITS = 128, 127, (0, 9)  # FUTEX_WAIT, FUTEX_WAIT_BITSET
CLOCK_CALLS = ("clock_gettime", "clock_getres", "clock_nanosleep")  # a negative clock id names another process's CPU
ARGUMENT_CHECKED = ("clone", "prctl", "futex", *CLOCK_CALLS)
# prctl options a program may use: PDEATHSIG set/get, GET_DUMPABLE, thread names, GET_SECCOMP, NO_NEW_PRIVS
# (set: one way, get), PR_SET_VMA (the C library names its mappings)
PRCTL_OPTIONS = (1, 2, 3, 15, 16, 21, 38, 39, 0x53564D41)
RET_ALLOW = 0x7FFF0000
RET_ERRNO = 0x00050000
PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2


def number(name: str, machine: str) -> int | None:
    """The syscall number of `name` on `machine` (x86_64 or aarch64), None where it does not exist there.

    >>> number("sysinfo", "x86_64"), number("sysinfo", "aarch64"), number("open", "aarch64")
    (99, 179, None)
    """
    return TABLE[name][{"x86_64": 0, "aarch64": 1}[machine]]


def allowed_numbers(machine: str) -> list[int]:
    """The allowed calls' numbers on `machine`, in ALLOWED's order (most frequent first), without those in
    ARGUMENT_CHECKED (checked with their arguments first)."""
    out: list[int] = []
    for names in ALLOWED.values():
        for name in names:
            nr = number(name, machine)
            if nr is not None and name not in ARGUMENT_CHECKED and nr not in out:
                out.append(nr)
    return out


def program(machine: str) -> list[tuple[int, int, int, int]]:
    """The filter as classic BPF (code, jt, jf, k), every jump short (each test is followed by its own return):

    1. another audit architecture: ENOSYS (an i386 ``int 0x80`` call is never compared against x86_64 numbers);
    2. a number with the x32 bit: ENOSYS;
    3. clone: EPERM with any CLONE_NEW* flag or CLONE_PIDFD, else allowed;
    4. prctl: allowed for PRCTL_OPTIONS, else EINVAL;
    5. futex: allowed with FUTEX_PRIVATE_FLAG; a shared wait returns EAGAIN at once (the C library's callers loop
       and re-check their word) and any other shared operation EINVAL (ignored by the C library's wakes). A shared
       futex on a file mapping is keyed by the file's inode and offset, so two runs mapping the same libc could
       wake each other: about 10 kbit/s between concurrent samples, found by the red team;
    6. clock_gettime, clock_getres, clock_nanosleep: EINVAL for a negative clock id (another process's CPU clock,
       the judge's among them), else allowed;
    7. each allowed number: allowed;
    8. anything else: ENOSYS.
    """
    ld, jeq, jge, jset, ret, and_ = 0x20, 0x15, 0x35, 0x45, 0x06, 0x54
    nosys, eperm, einval, eagain = (RET_ERRNO | e for e in (errno.ENOSYS, errno.EPERM, errno.EINVAL, errno.EAGAIN))
    insns = [
        (ld, 0, 0, 4),  # seccomp_data.arch
        (jeq, 1, 0, AUDIT[machine]),
        (ret, 0, 0, nosys),
        (ld, 0, 0, 0),  # seccomp_data.nr
        (jge, 0, 1, X32_BIT),
        (ret, 0, 0, nosys),
        (jeq, 0, 4, number("clone", machine)),
        (ld, 0, 0, 16),  # args[0], low 32 bits: clone's flags
        (jset, 0, 1, CLONE_REFUSED),
        (ret, 0, 0, eperm),
        (ret, 0, 0, RET_ALLOW),
    ]
    options = [insn for opt in PRCTL_OPTIONS for insn in ((jeq, 0, 1, opt), (ret, 0, 0, RET_ALLOW))]
    block = [(ld, 0, 0, 16), *options, (ret, 0, 0, einval)]  # args[0]: the option
    insns += [(jeq, 0, len(block), number("prctl", machine)), *block]
    block = [
        (ld, 0, 0, 24),  # args[1], low 32 bits: the futex operation
        (jset, 0, 1, FUTEX_PRIVATE_FLAG),
        (ret, 0, 0, RET_ALLOW),
        (and_, 0, 0, FUTEX_CMD_MASK),
        *[insn for cmd in FUTEX_WAITS for insn in ((jeq, 0, 1, cmd), (ret, 0, 0, eagain))],
        (ret, 0, 0, einval),
    ]
    insns += [(jeq, 0, len(block), number("futex", machine)), *block]
    block = [(ld, 0, 0, 16), (jset, 0, 1, 0x80000000), (ret, 0, 0, einval), (ret, 0, 0, RET_ALLOW)]  # args[0] < 0
    for name in CLOCK_CALLS:
        insns += [(jeq, 0, len(block), number(name, machine)), *block]
    for nr in allowed_numbers(machine):
        insns += [(jeq, 0, 1, nr), (ret, 0, 0, RET_ALLOW)]
    insns.append((ret, 0, 0, nosys))
    return insns


def install() -> bool:
    """Install ``program`` in this process (and its future children) after setting no-new-privileges; False where
    the machine has no syscall table here (neither x86_64 nor aarch64)."""
    machine = os.uname().machine
    if machine not in AUDIT:
        return False
    insns = program(machine)

    class Filter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)]

    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Filter))]

    filters = (Filter * len(insns))(*[Filter(*insn) for insn in insns])
    prog = Prog(len(insns), filters)
    libc = ctypes.CDLL(None, use_errno=True)
    zero = ctypes.c_ulong(0)
    steps = (
        (PR_SET_NO_NEW_PRIVS, ctypes.c_ulong(1), zero),
        (PR_SET_SECCOMP, ctypes.c_ulong(SECCOMP_MODE_FILTER), ctypes.byref(prog)),
    )
    for option, arg, arg2 in steps:
        if libc.prctl(option, arg, arg2, zero, zero) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"seccomp: {os.strerror(err)}")
    return True
