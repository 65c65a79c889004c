"""Which isolation this machine allows, found once per process by running a probe program through each setup.

Preference order (the first whose probe passes wins; every step down is logged once as a warning naming what is
lost, see docs/code.md "Fallbacks"):

1. root with ``unshare --mount --net --pid --ipc --fork --kill-child --mount-proc``: the run's own root (private
   copies of the files Python needs and a scratch tmpfs mounted noexec, nosuid, nodev, no inode of the host:
   grpolab.sandbox.confine and grpolab.sandbox.image), no network, its own SysV IPC and POSIX message queues, the
   judge is PID 1 of its namespace (killing it ends every descendant), programs run as an unprivileged uid and
   their judge as another;
2. root with ``unshare --net --pid --ipc --fork --kill-child`` (no mount namespace);
3. root with ``unshare --net --ipc``;
4. root without namespaces: sockets, keys and IPC refused by the seccomp filter, stragglers killed by uid;
5. not root, with an unprivileged user namespace (``unshare --user --map-root-user ...``): the namespaces of 1
   but the program runs as your own user;
6. not root, no namespaces: rlimits and the seccomp filter only.

Every setup also installs the seccomp filter in the program's process (x86_64 and aarch64; an allow-list,
grpolab.sandbox.seccomp). Only setups with a mount namespace (1, 5) mount the scratch noexec: the others run the
program in a host directory (``Isolation.missing`` says so at start-up).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

FULL_NS = ("--mount", "--net", "--pid", "--ipc", "--fork", "--kill-child", "--mount-proc")
PID_NET_NS = ("--net", "--pid", "--ipc", "--fork", "--kill-child")
SECCOMP_MACHINES = ("x86_64", "aarch64")


@dataclass(frozen=True)
class Isolation:
    """What the sandbox uses on this machine. `unshare` is the command prefix (empty: none)."""

    unshare: tuple[str, ...] = ()
    net: bool = False
    pid: bool = False
    mounts: bool = False
    ipc: bool = False
    uid_drop: bool = False
    seccomp: bool = False
    name: str = "none"

    def command(self) -> list[str]:
        return list(self.unshare)

    def missing(self) -> list[str]:
        """One line per protection this setup lacks, saying what that means (logged once at start-up)."""
        out = []
        if not self.uid_drop:
            out.append(
                "programs run as your own user (not root, so no drop to an unprivileged uid): they can read and "
                "delete what you can, write where the judge imports from if your Python installation is yours, "
                "and the process-count limit counts all your processes; the judge shares that uid, so a "
                "program can lower the judge's limits and, without a PID namespace, signal it (its own "
                "result can be lost, never another program's)"
            )
        if not self.seccomp:
            out.append(
                "no seccomp filter (a machine neither x86_64 nor aarch64): programs can leave keys in the "
                "sandbox uid's kernel keyring, and sockets and IPC are held back by namespaces alone"
            )
        if not self.net:
            out.append(
                "no network namespace: "
                + (
                    "network sockets are refused by the seccomp filter"
                    if self.seccomp
                    else "NETWORK ACCESS IS NOT BLOCKED"
                )
            )
        if not self.ipc:
            out.append(
                "no IPC namespace: "
                + (
                    "SysV IPC and POSIX message queues are refused by the seccomp filter"
                    if self.seccomp
                    else "SYSV IPC AND POSIX MESSAGE QUEUES ARE SHARED between runs and with the host"
                )
            )
        if not self.pid:
            out.append(
                "no PID namespace: "
                + (
                    "processes that leave the program's process group are killed by uid"
                    if self.uid_drop
                    else "a process that calls setsid can outlive its run"
                )
            )
        if not self.mounts:
            out.append(
                "no mount namespace: programs see the host's files (data files and the trainer's source among "
                "them, where others may read them), can leave files in world-writable host directories (/tmp, "
                "/var/tmp, /dev/shm, ...) without an inode limit, run in a host working directory (removed "
                "afterwards) that is not mounted noexec, nosuid, nodev (exec is refused by the seccomp filter, "
                "but a file written there can be mapped executable), read host-wide counters in /proc (load, "
                "free memory: a channel between runs at the same time), and share the host's page cache, file "
                "locks and directory cache with the host and with each other (a channel between runs, and a cost "
                "on the host)"
            )
        return out


def candidates(unshare: str | None, root: bool, seccomp: bool) -> list[Isolation]:
    """The setups to probe, best first.

    >>> [c.name for c in candidates("/usr/bin/unshare", True, True)]
    ['full', 'net+pid', 'net', 'rlimits']
    """
    base = Isolation(seccomp=seccomp, uid_drop=root)
    if root:
        out = (
            [
                replace(base, unshare=(unshare, *FULL_NS), net=True, pid=True, ipc=True, mounts=True, name="full"),
                replace(base, unshare=(unshare, *PID_NET_NS), net=True, pid=True, ipc=True, name="net+pid"),
                replace(base, unshare=(unshare, "--net", "--ipc"), net=True, ipc=True, name="net"),
            ]
            if unshare
            else []
        )
        return out + [replace(base, name="rlimits")]
    user = (
        [
            replace(
                base,
                unshare=(unshare, "--user", "--map-root-user", *FULL_NS),
                net=True,
                pid=True,
                ipc=True,
                mounts=True,
                name="user-ns",
            )
        ]
        if unshare
        else []
    )
    return user + [replace(base, name="rlimits")]
