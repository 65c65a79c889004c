"""How the judge confines a run, as root inside its fresh namespaces, before the judge and the worker each drop to
their own unprivileged uid (standard library only; loaded by the judge with harness.py; docs/code.md "The
sandbox").

- ``new_root``: the program sees an allowlist, and no inode of the host. The root is a fresh tmpfs holding the
  run's private copies of the files Python needs (grpolab.sandbox.image: the standard library's compiled zip, its
  extension modules and their libraries, a few files of /etc), fresh device nodes (DEVICES) on a tmpfs of their
  own, and one scratch tmpfs with a size *and* an inode limit that provides the working directory, /tmp, /var/tmp
  and /dev/shm, mounted noexec, nosuid, nodev. No /proc, no /sys, no executable. The old root is detached: no
  home directory, repository, data file or dataset cache of the host exists inside, and nothing of the host is
  readable, writable or lockable.
  Where the private copy could not be built, the fallback is the earlier allowlist of read-only bind mounts of
  the host's system directories (``_system``), with a warning.
- ``prepare``: that root and the rlimits (as root); ``drop``: one process to its uid, no new privileges,
  non-dumpable; ``writable_import_paths``: the worker's check that it cannot write where the judge imports from.
- ``close_inherited``: the worker's close_range of every descriptor but its pipes; ``install_seccomp``: its
  system-call allow-list (grpolab.sandbox.seccomp).
"""

from __future__ import annotations

import ctypes
import importlib
import os
import resource
import sys

try:
    from . import seccomp
except ImportError:  # loaded by the judge as a top-level module
    import seccomp  # type: ignore

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT = 1, 2, 4, 32
MS_BIND, MS_MOVE, MS_REC, MS_PRIVATE = 4096, 8192, 16384, 1 << 18
MNT_DETACH = 2
KEEP_FLAGS = os.ST_NOEXEC | os.ST_NOATIME | os.ST_NODIRATIME | os.ST_RELATIME  # kept when a bind turns read-only
PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS = 4, 38
MS_NOEXEC = 8
CLOSE_RANGE_LAST = 0xFFFFFFFF  # close_range(2)'s "every descriptor above first"
NR_OPEN_DEFAULT = 1 << 20  # fs.nr_open's default: no descriptor number reaches it unless raised
DEVICE_NUMBERS = {"null": (1, 3), "zero": (1, 5), "full": (1, 7), "random": (1, 8), "urandom": (1, 9)}
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
ETC_FILES = ("ld.so.cache", "localtime", "passwd", "group")
DEVICES = ("null", "zero", "full", "random", "urandom")


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = lambda s: None if s is None else s.encode()  # noqa: E731
    _check(_libc().mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)), f"mount {target}")


def prctl(option: int, arg: int, *rest: int) -> None:
    args = [ctypes.c_ulong(a) for a in (arg, *rest, 0, 0, 0)[:4]]
    _check(_libc().prctl(option, *args), f"prctl {option}")


# ----------------------------------------------------------------------------------------------- the new root


def _mount_point(path: str, directory: bool) -> None:
    if directory:
        os.makedirs(path, 0o755, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(path), 0o755, exist_ok=True)
        open(path, "a").close()


def bind(src: str, dst: str, readonly: bool = True, recursive: bool = False) -> None:
    """Bind `src` at `dst` (read-only unless told otherwise, keeping the source's noexec / atime flags)."""
    _mount_point(dst, os.path.isdir(src))
    mount(src, dst, None, MS_BIND | (MS_REC if recursive else 0))
    if readonly:
        flags = os.statvfs(dst).f_flag & KEEP_FLAGS
        mount(None, dst, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | flags)


def stdlib_dirs() -> list[str]:
    """The existing absolute directories on the judge's import path (the standard library), resolved."""
    return sorted({os.path.realpath(p) for p in sys.path if p.startswith("/") and os.path.isdir(p)})


def package_dirs(libs: list[str]) -> list[str]:
    """Third-party package directories: every lib/python3*/{site,dist}-packages under /usr, /usr/local and the
    standard library's parent directory."""
    parents = {"/usr/lib", "/usr/lib64", "/usr/local/lib", "/usr/local/lib64"} | {os.path.dirname(d) for d in libs}
    out = []
    for parent in sorted(parents):
        try:
            names = os.listdir(parent)
        except OSError:
            continue
        for name in sorted(n for n in names if n.startswith("python3")):
            subdirs = (os.path.join(parent, name, s) for s in ("site-packages", "dist-packages"))
            out += [p for p in subdirs if os.path.isdir(p)]
    return out


def _scratch(root: str, cfg: dict) -> None:
    """One tmpfs (size disk_mb, max_files inodes) behind the working directory (``cfg["home"]``), /tmp, /var/tmp
    and /dev/shm, mounted noexec, nosuid and nodev (each bind remounted with the same flags, not trusting them to
    be inherited): a program cannot exec, or map executable, a file it wrote there."""
    stage, uid = os.path.join(root, ".scratch"), cfg.get("uid")
    os.mkdir(stage, 0o700)
    flags = MS_NOSUID | MS_NODEV | MS_NOEXEC
    mount(
        "tmpfs", stage, "tmpfs", flags, f"size={int(cfg['disk_mb'])}m,nr_inodes={int(cfg['max_files']) + 5},mode=0755"
    )
    for name, target in (("tmp", "/tmp"), ("var-tmp", "/var/tmp"), ("shm", "/dev/shm"), ("work", cfg["home"])):
        os.mkdir(os.path.join(stage, name), 0o700 if name == "work" else 0o1777)
        os.chmod(os.path.join(stage, name), 0o700 if name == "work" else 0o1777)
        if name == "work" and uid is not None:
            os.chown(os.path.join(stage, name), uid, uid)
        bind(os.path.join(stage, name), root + target, readonly=False)
        mount(None, root + target, None, MS_REMOUNT | MS_BIND | flags)
    _check(_libc().umount2(stage.encode(), MNT_DETACH), "umount scratch")
    os.rmdir(stage)


def _system(root: str) -> None:
    """The system directories, the standard library (package directories hidden), /etc files, devices, /proc."""
    libs, bound = stdlib_dirs(), []
    for path in [d for d in SYSTEM_DIRS if os.path.lexists(d)] + libs:
        if os.path.islink(path):
            os.makedirs(os.path.dirname(root + path), 0o755, exist_ok=True)
            os.symlink(os.readlink(path), root + path)
        elif not any(path == b or path.startswith(b + "/") for b in bound):  # not inside a directory bound already
            bind(path, root + path)
            bound.append(path)
    for path in package_dirs(libs):
        mount("tmpfs", root + path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, "size=4k,nr_inodes=2,mode=0755")
    for name in ETC_FILES:
        if os.path.isfile(f"/etc/{name}"):
            bind(os.path.realpath(f"/etc/{name}"), f"{root}/etc/{name}")
    for name in DEVICES:
        bind(f"/dev/{name}", f"{root}/dev/{name}", readonly=False)
    for i, name in enumerate(("stdin", "stdout", "stderr")):
        os.symlink(f"/proc/self/fd/{i}", f"{root}/dev/{name}")
    os.symlink("/proc/self/fd", f"{root}/dev/fd")
    bind("/proc", f"{root}/proc", readonly=False, recursive=True)
    bind(f"{root}/proc/sys", f"{root}/proc/sys")


def _copy(src_fd: int, size: int, dst: str, mode: int) -> None:
    """Copy `size` bytes of `src_fd` (from offset 0, without moving its offset) to the new file `dst`."""
    os.makedirs(os.path.dirname(dst), 0o755, exist_ok=True)
    out = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        done = 0
        while done < size:
            sent = os.sendfile(out, src_fd, done, size - done)
            if sent == 0:
                raise OSError(f"short copy of {dst}")
            done += sent
    finally:
        os.close(out)


def _loaded_files() -> set[str]:
    """The files of the modules this process imported already (the worker, its fork, never opens them again)."""
    return {
        os.path.realpath(f) for m in list(sys.modules.values()) if isinstance(f := getattr(m, "__file__", None), str)
    }


def _devices(root: str) -> None:
    """Fresh device nodes on a tmpfs of their own (so no lock or open of the program touches a host inode);
    where mknod is not allowed (a user namespace), read-write binds of the host's nodes instead."""
    dev = root + "/dev"
    os.makedirs(dev, 0o755, exist_ok=True)
    mount("tmpfs", dev, "tmpfs", MS_NOSUID | MS_NOEXEC, "size=64k,nr_inodes=16,mode=0755")
    for name in DEVICES:
        try:
            os.mknod(f"{dev}/{name}", 0o666 | 0o020000, os.makedev(*DEVICE_NUMBERS[name]))
            os.chmod(f"{dev}/{name}", 0o666)
        except PermissionError:
            bind(f"/dev/{name}", f"{dev}/{name}", readonly=False)


def _private_system(root: str, image: dict) -> None:
    """The run's own copies (grpolab.sandbox.image): the standard library's zip from the sealed memfd, the
    extension modules not loaded yet and their libraries, /etc files; then the devices."""
    _copy(image["zip_fd"], int(image["zip_bytes"]), root + image["zip_path"], 0o644)
    os.close(image["zip_fd"])
    loaded = _loaded_files()
    for path in image["files"]:
        if os.path.realpath(path) in loaded:
            continue
        fd = os.open(path, os.O_RDONLY)
        try:
            _copy(fd, os.fstat(fd).st_size, root + path, 0o755 if ".so" in os.path.basename(path) else 0o644)
        finally:
            os.close(fd)
    _devices(root)


def _use_private_path(image: dict) -> None:
    """The judge's import path in the new root: the zip and the extension modules' copy, caches dropped, and the
    packages imported before the switch (encodings, collections, ...) looking for their submodules in the zip."""
    sys.path[:] = list(image["path"])
    stdlib = image["stdlib"].rstrip("/") + "/"
    for module in list(sys.modules.values()):
        path = getattr(module, "__path__", None)
        if type(path) is list:
            path[:] = [image["zip_path"] + "/" + p[len(stdlib) :] if p.startswith(stdlib) else p for p in path]
    sys.path_importer_cache.clear()
    importlib.invalidate_caches()


def new_root(cfg: dict) -> None:
    """Build the allowlisted root on a tmpfs mounted over ``cfg["workdir"]`` (an empty host directory), switch to
    it, detach the old root, make the root read-only and enter the working directory ``cfg["home"]``."""
    root, image = cfg["workdir"], cfg.get("image")
    os.umask(0o022)
    mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing below propagates to the host
    size = (int(image["zip_bytes"]) + sum(os.path.getsize(p) for p in image["files"]) if image else 0) + (1 << 20)
    mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, f"size={size},nr_inodes=4096,mode=0755")
    if image:
        _private_system(root, image)
    else:
        _system(root)
    _scratch(root, cfg)
    if image:  # the device tmpfs read-only too, now that /dev/shm is mounted on it
        mount(None, root + "/dev", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NOEXEC)
    os.chdir(root)
    machine = os.uname().machine
    if machine in seccomp.AUDIT:
        _check(_libc().syscall(seccomp.number("pivot_root", machine), b".", b"."), "pivot_root")
        _check(_libc().umount2(b".", MNT_DETACH), "detach the old root")
    else:  # no syscall table for pivot_root: move the new root over / (the old one stays, unreachable)
        mount(root, "/", None, MS_MOVE)
        os.chroot(".")
    os.chdir("/")
    mount(None, "/", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    if image:
        _use_private_path(image)
    os.chdir(cfg["home"])


# ----------------------------------------------------------------------------------------------- the drop


def writable_import_paths() -> list[str]:
    """Entries of sys.path under which this process could create a module (checked on the nearest existing
    ancestor of each entry)."""
    out = []
    for entry in sys.path:
        probe = entry or "."
        while not os.path.exists(probe) and probe not in ("/", ""):
            probe = os.path.dirname(probe)
        if not entry.startswith("/") or os.access(probe, os.W_OK):
            out.append(entry)
    return out


def prepare(cfg: dict) -> None:
    """As root, before the judge forks the worker: the run pinned to its slot's CPU (``cfg["cpu"]``), the new root
    (in a mount namespace) and the rlimits both processes keep (RLIMIT_CORE's hard limit 1 among them: no core
    dump of any kind, pipes to a helper included).

    The pinning closes the strongest channel between samples that run at the same time: with each slot on a CPU
    of its own, a program that keeps CPUs busy slows only itself, not a neighbour timing its own loop (measured
    at 5 bit/s error-free, 15-18 bit/s with errors, unpinned: docs/code.md). The program cannot move itself
    (sched_setaffinity is off the allow-list) and its children inherit the CPU."""
    if cfg.get("cpu") is not None:
        try:
            os.sched_setaffinity(0, {int(cfg["cpu"])})
        except OSError:  # the CPU went offline or out of this cpuset since the runner looked: run unpinned
            pass
    if cfg.get("mounts"):
        new_root(cfg)
    for name, (soft, hard) in cfg["rlimits"].items():
        resource.setrlimit(getattr(resource, name), (soft, hard))


def drop(uid: int | None) -> None:
    """This process to `uid` (real, effective and saved; no groups) where one is given, then non-dumpable (no
    /proc access, no ptrace, no core dump by another uid) and no new privileges."""
    if uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    prctl(PR_SET_DUMPABLE, 0)
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    os.umask(0o077)


def _close_range(first: int, last: int) -> None:
    """close_range(2) of [first, last]; where the kernel lacks it (before 5.9: ENOSYS), each number up to
    NR_OPEN_DEFAULT (the kernel's default ceiling on a descriptor's number) one by one."""
    machine = os.uname().machine
    if machine in seccomp.AUDIT:
        nr = seccomp.number("close_range", machine)
        if _libc().syscall(nr, ctypes.c_uint(first), ctypes.c_uint(last), ctypes.c_uint(0)) == 0:
            return
    for fd in range(first, min(last, NR_OPEN_DEFAULT - 1) + 1):
        try:
            os.close(fd)
        except OSError:
            pass


def close_inherited(keep: set[int]) -> None:
    """Close every descriptor of this process but `keep`, however high its number: the trainer (or whatever
    started it) may hold descriptors far above any bound a loop would assume (the worker used to stop at 4096),
    and ``os.closerange`` stops at the soft RLIMIT_NOFILE where it has to walk one by one."""
    first = 0
    for fd in sorted(keep):
        if fd > first:
            _close_range(first, fd - 1)
        first = fd + 1
    _close_range(first, CLOSE_RANGE_LAST)


def install_seccomp() -> bool:
    """The worker's system-call filter (grpolab.sandbox.seccomp: an allow-list, the architecture checked); False
    where the machine has no syscall table there."""
    return seccomp.install()
