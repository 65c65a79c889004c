"""User-facing errors: the CLI prints their message on one line and exits non-zero, without a traceback; and the
checks of output paths that raise them before any work (writable_dir, writable_file)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


class GrpolabError(Exception):
    """Bad input or an unrecoverable run condition, with a message that names the field/row/file."""


class ConfigError(GrpolabError):
    """A config field is unknown, mistyped or out of range."""


class DataError(GrpolabError):
    """A data file is missing, unreadable or has malformed rows."""


class OutputError(GrpolabError):
    """An output path cannot be written (a directory where a file is expected, a read-only place, a parent that is a
    file); raised before the work that would fill it."""


def writable_dir(path: str | os.PathLike, what: str) -> Path:
    """`path` as a directory that exists (created with its parents) and accepts a new file, checked by creating and
    removing one; else one OutputError naming `what` (the option or field) and the path."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise OutputError(f"{what}: {p} is a file; expected a directory")
    try:
        p.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".grpolab-write-check-", dir=p)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise OutputError(f"{what}: cannot write into {p} ({e.strerror or e})") from None
    return p


def writable_file(path: str | os.PathLike, what: str) -> Path:
    """`path` as a file that can be written: not a directory, its parent directory created when missing and
    writable, an existing file writable; else one OutputError naming `what` and the path. Nothing is written to it."""
    p = Path(path)
    if p.is_dir():
        raise OutputError(f"{what}: {p} is a directory; expected a file path such as {p / 'result.json'}")
    writable_dir(p.parent, what)
    if p.exists() and not os.access(p, os.W_OK):
        raise OutputError(f"{what}: {p} exists and is not writable")
    return p
