"""The files a run may read, as per-run private copies (docs/code.md, "What the sandbox defends").

A run's root holds no inode of the host: every file the program can open is a copy the judge makes for that run
alone, on the run's own tmpfs (grpolab.sandbox.confine). So no run can observe what another wrote -- cache
residency (a tmpfs page is always resident and cannot be evicted by fadvise), locks, inotify events, access times
-- and nothing it does costs the host anything once its tmpfs is gone (no negative dentries under host
directories, no evicted host pages, no lock on a host file).

What is copied, found once per interpreter (``stdlib_image``):

- the standard library as one zip of compiled modules (the interpreter's own ``__pycache__`` entries, compiled
  where missing; no sources, no test suites, no GUI, installer, asyncio, multiprocessing, mail-protocol or
  database packages: SKIPPED_PACKAGES and SKIPPED_MODULES), built by that interpreter
  (``python -S image.py`` writes it to stdout) and kept in a sealed memfd that every judge copies from;
- its extension modules (lib-dynload) and the shared libraries they need that the interpreter has not loaded
  already (found with ``ldd``), at their own paths;
- ld.so.cache and a few files of /etc.

There is no executable in the root: a program cannot start another program (fork and threads work).
"""

from __future__ import annotations

import functools
import glob
import json
import logging
import os
import subprocess
import sys
import threading
from dataclasses import dataclass

log = logging.getLogger("grpolab")

# standard-library packages and modules a program has no use for in a judge (tests, GUI, installers, docs)
SKIPPED_PACKAGES = frozenset(
    {
        "test",
        "idlelib",
        "tkinter",
        "turtledemo",
        "lib2to3",
        "ensurepip",
        "distutils",
        "pydoc_data",
        "venv",
        "msilib",
        "site-packages",
        "dist-packages",
        "__pycache__",
        "asyncio",
        "xmlrpc",
        "wsgiref",
        "multiprocessing",
        "curses",
        "dbm",
        "sqlite3",
    }
)
SKIPPED_MODULES = frozenset(
    {
        "turtle.py",
        "pydoc.py",
        "mailbox.py",
        "smtplib.py",
        "imaplib.py",
        "nntplib.py",
        "poplib.py",
        "ftplib.py",
        "telnetlib.py",
        "smtpd.py",
        "cgi.py",
        "cgitb.py",
    }
)
SKIPPED_EXTENSIONS = (
    "_test",
    "xx",
    "_xx",
    "_ctypes_test",
    "_tkinter",
    "_curses",
    "readline",
    "_dbm",
    "_gdbm",
    "nis",
    "_sqlite3",
    "_ssl",
    "_hashlib",
    "ossaudiodev",
    "spwd",
    "_crypt",
    "_codecs_",
    "audioop",
    "_asyncio",
    "_multiprocessing",
    "_posixshmem",
    "_lsprof",
    "syslog",
    "termios",
)
LOADED_LIBS = (
    "libc.so",
    "libm.so",
    "libpthread.so",
    "libdl.so",
    "librt.so",
    "ld-linux",
    "libpython",
    "linux-vdso",
    "ld64.so",
)
ETC_FILES = ("ld.so.cache", "localtime", "passwd", "group")
MFD_CLOEXEC, MFD_ALLOW_SEALING = 1, 2
F_ADD_SEALS, SEALS = 1033, 0x1 | 0x2 | 0x4 | 0x8  # F_SEAL_SEAL | SHRINK | GROW | WRITE


@dataclass(frozen=True)
class StdlibImage:
    """What each run gets a private copy of. `zip_fd`: a sealed memfd holding the standard library's zip, to be
    written at `zip_path`; `files`: host files copied to the same path; `path`: the judge's sys.path in the root;
    `stdlib`: the host's standard-library directory (packages imported before the switch are pointed into the zip)."""

    zip_fd: int
    zip_path: str
    stdlib: str
    files: tuple[str, ...]
    path: tuple[str, ...]
    zip_bytes: int


# ----------------------------------------------------------------------------------------------- the builder


def _pyc(source: str) -> bytes | None:
    """The compiled module of `source` for this interpreter: its __pycache__ entry when it matches this
    interpreter's magic number, else compiled here (None when the source does not compile)."""
    import importlib.util
    from importlib import _bootstrap_external

    cached = importlib.util.cache_from_source(source)
    try:
        with open(cached, "rb") as fh:
            data = fh.read()
        if data[:4] == importlib.util.MAGIC_NUMBER:
            return data
    except OSError:
        pass
    try:
        with open(source, "rb") as fh:
            code = compile(fh.read(), source, "exec", dont_inherit=True)
    except (SyntaxError, ValueError, OSError):
        return None
    st = os.stat(source)
    return bytes(_bootstrap_external._code_to_timestamp_pyc(code, int(st.st_mtime), st.st_size))


def build(out) -> None:
    """Write a JSON header line (zip path, extension directory, extension modules) and then the standard
    library's zip (compiled modules only, stored) to the binary stream `out`. Run by the interpreter the
    sandbox uses, with -S."""
    import io
    import sysconfig
    import zipfile

    stdlib = os.path.realpath(sysconfig.get_paths()["stdlib"])
    dynload = next((os.path.realpath(p) for p in sys.path if p.endswith("lib-dynload") and os.path.isdir(p)), "")
    zip_path = next((p for p in sys.path if p.endswith(".zip")), stdlib + ".zip")
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        for root, dirs, files in os.walk(stdlib):
            rel = os.path.relpath(root, stdlib)
            dirs[:] = sorted(
                d
                for d in dirs
                if d not in SKIPPED_PACKAGES and not (rel == "." and d.startswith("config-")) and d != "tests"
            )
            for name in sorted(f for f in files if f.endswith(".py") and not (rel == "." and f in SKIPPED_MODULES)):
                data = _pyc(os.path.join(root, name))
                if data is not None:
                    zf.writestr(os.path.normpath(os.path.join(rel, name[:-3] + ".pyc")), data)
    extensions = (
        sorted(
            p
            for p in glob.glob(os.path.join(dynload, "*.so"))
            if not os.path.basename(p).startswith(SKIPPED_EXTENSIONS)
        )
        if dynload
        else []
    )
    header = {"zip_path": zip_path, "dynload": dynload, "extensions": extensions, "stdlib": stdlib}
    out.write(json.dumps(header).encode() + b"\n")
    out.write(buf.getvalue())
    out.flush()


# ----------------------------------------------------------------------------------------------- the runner's side


def needed_libraries(objects: list[str]) -> list[str]:
    """The shared libraries `objects` need (by ``ldd``) that are not loaded by every Python process already
    (the C library, libm, libpython, the loader): they must exist in the run's root for dlopen."""
    if not objects:
        return []
    try:
        text = subprocess.run(["ldd", *objects], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    found = set()
    for line in text.splitlines():
        parts = line.split("=>")
        if len(parts) == 2 and parts[1].strip().startswith("/"):
            path = parts[1].split()[0]
            if not any(tag in os.path.basename(path) for tag in LOADED_LIBS):
                found.add(path)
    return sorted(found)


def _sealed_memfd(data: bytes) -> int:
    fd = os.memfd_create("grpolab-stdlib", MFD_CLOEXEC | MFD_ALLOW_SEALING)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    import fcntl

    fcntl.fcntl(fd, F_ADD_SEALS, SEALS)
    return fd


_build_lock = threading.Lock()


def stdlib_image(python: str) -> StdlibImage | None:
    """The private-copy image for the interpreter `python` (built once per process, whichever thread asks first;
    None, with a warning, where it cannot be built: the sandbox then falls back to read-only views of the host's
    directories)."""
    with _build_lock:
        return _build_image(python)


@functools.lru_cache(maxsize=4)
def _build_image(python: str) -> StdlibImage | None:
    try:
        proc = subprocess.run(
            [python, "-s", "-S", "-B", os.path.abspath(__file__)],
            capture_output=True,
            timeout=300,
            env={"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8"},
        )
        head, _, data = proc.stdout.partition(b"\n")
        if proc.returncode != 0 or not data:
            raise RuntimeError(proc.stderr.decode(errors="replace").strip().splitlines()[-1:] or "no output")
        header = json.loads(head)
        extensions = [p for p in header["extensions"] if os.path.isfile(p)]
        etc = [f"/etc/{name}" for name in ETC_FILES if os.path.isfile(f"/etc/{name}")]
        files = tuple(extensions + needed_libraries(extensions) + etc)
        path = (header["zip_path"],) + ((header["dynload"],) if header["dynload"] else ())
        return StdlibImage(_sealed_memfd(data), header["zip_path"], header["stdlib"], files, path, len(data))
    except (OSError, ValueError, KeyError, RuntimeError, subprocess.SubprocessError) as exc:
        log.warning(
            "sandbox: cannot build the private copy of the standard library (%s); runs will see read-only "
            "views of the host's directories, which share the host's page cache and file locks",
            exc,
        )
        return None


if __name__ == "__main__":
    build(sys.stdout.buffer)
