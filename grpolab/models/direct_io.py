"""Checkpoint files written past the page cache (O_DIRECT): `DirectFile`, `save_safetensors`, `torch_save`.

A full checkpoint (weights and both optimizer moments: 1.6 GB for a 135M-parameter model in float32) written the usual
way is first copied into freshly allocated page-cache pages, which a kept file holds on to, so every checkpoint
allocates afresh; writing straight from memory to the disk skips that copy (docs/performance.md, "Levers"
(checkpoints written past the page cache) and "Checkpoint writes").

`DirectFile` copies what it is given into a page-aligned 16 MiB buffer and writes it with O_DIRECT at its offset; at
`close` the last block is padded, the file truncated to its true length and fsync'ed. Where O_DIRECT is unavailable
(not Linux) or refused (tmpfs, some network filesystems: EINVAL at open or at any write) it goes on through the page
cache from where it was, with the same bytes. The files are ordinary for `torch.load` and safetensors. It also keeps
the CRC-32 of what it was given (never reading the file back), which the checkpoint records in checksums.json so a
resume can tell a damaged file from an intact one.

`save_safetensors` writes the safetensors layout (8-byte little-endian header length, the JSON header padded with
spaces to 8 bytes, then each tensor's bytes at its offsets; https://huggingface.co/docs/safetensors) into a
`DirectFile`, since the library writes only through the page cache. Tested against safetensors' own reader.
"""

from __future__ import annotations

import errno
import fcntl
import json
import mmap
import os
import struct
import sys
import zlib
from pathlib import Path
from typing import Any

import torch

ALIGN = 4096  # O_DIRECT offsets, lengths and buffer addresses: a multiple of the device's logical block size
BUFFER_BYTES = 16 << 20

SAFETENSORS_DTYPES = {  # in the order of the format's dtype enumeration, which orders a file's tensors
    torch.bool: "BOOL",
    torch.uint8: "U8",
    torch.int8: "I8",
    torch.int16: "I16",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int32: "I32",
    torch.float32: "F32",
    torch.float64: "F64",
    torch.int64: "I64",
}
_DTYPE_RANK = {dtype: rank for rank, dtype in enumerate(SAFETENSORS_DTYPES)}


class DirectFile:
    """A write-only binary file written with O_DIRECT through a page-aligned buffer (see the module text); `close`
    (or leaving the `with` block without an error) pads, truncates and fsyncs. `direct` says which way it writes;
    `size` and `crc32` are the length and the CRC-32 (zlib's, of every byte given to `write`) of the file's content,
    which a checkpoint records to verify the file on resume (grpolab.models.checkpoint)."""

    def __init__(self, path: str | os.PathLike, direct: bool = True):
        self.path = Path(path)
        self.direct = direct and hasattr(os, "O_DIRECT")
        self._fd = self._open()
        try:
            self._buffer = mmap.mmap(-1, BUFFER_BYTES)  # anonymous mappings start on a page boundary
        except BaseException:
            os.close(self._fd)
            raise
        self._view = memoryview(self._buffer)
        self._filled = 0
        self._on_disk = 0  # bytes written to the file so far
        self.size = 0  # bytes given to `write`
        self.crc32 = 0  # zlib.crc32 of those bytes, updated as they come

    def _open(self) -> int:
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
        if self.direct:
            try:
                return os.open(self.path, flags | os.O_DIRECT, 0o644)
            except OSError as e:
                if e.errno != errno.EINVAL:
                    raise
                self.direct = False
        return os.open(self.path, flags, 0o644)

    def write(self, data) -> int:
        source = memoryview(data).cast("B")
        self.crc32 = zlib.crc32(source, self.crc32)
        done = 0
        while done < len(source):
            n = min(BUFFER_BYTES - self._filled, len(source) - done)
            self._view[self._filled : self._filled + n] = source[done : done + n]
            self._filled += n
            done += n
            if self._filled == BUFFER_BYTES:
                self._write_buffer(BUFFER_BYTES)
        self.size += done
        return done

    def flush(self) -> None:
        """Nothing to do before `close` (torch.save calls it): the buffer is written when full or at close."""

    def _write_buffer(self, length: int) -> None:
        try:
            _write_all(self._fd, self._view[:length], self._on_disk)
        except OSError as e:
            if not (self.direct and e.errno == errno.EINVAL):
                raise
            # the filesystem opened with O_DIRECT but refuses this write: the rest goes through the page cache,
            # from this buffer's offset (positional writes: whatever part of it did reach the disk is written again)
            fcntl.fcntl(self._fd, fcntl.F_SETFL, fcntl.fcntl(self._fd, fcntl.F_GETFL) & ~os.O_DIRECT)
            self.direct = False
            _write_all(self._fd, self._view[:length], self._on_disk)
        self._on_disk += length
        self._filled = 0

    def close(self) -> None:
        if self._fd < 0:
            return
        try:
            if self._filled:
                length = -(-self._filled // ALIGN) * ALIGN if self.direct else self._filled
                self._view[self._filled : length] = bytes(length - self._filled)
                self._write_buffer(length)
            os.ftruncate(self._fd, self.size)
            os.fsync(self._fd)
        finally:
            self._release()

    def _release(self) -> None:
        os.close(self._fd)
        self._fd = -1
        self._view.release()
        try:
            self._buffer.close()
        except BufferError:  # an exception's traceback still holds a slice of it: freed with the traceback
            pass

    def __enter__(self) -> "DirectFile":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        elif self._fd >= 0:
            self._release()  # the caller removes the partial file (checkpoints are written in a temporary directory)


def _write_all(fd: int, view: memoryview, offset: int) -> None:
    """All of `view` at file offset `offset` (os.pwrite until done; a write of 0 bytes is an error, not a retry)."""
    done = 0
    while done < len(view):
        n = os.pwrite(fd, view[done:], offset + done)
        if n <= 0:
            raise OSError(errno.EIO, f"write of {len(view) - done} bytes at offset {offset + done} wrote nothing")
        done += n


def torch_save(obj: Any, path: str | os.PathLike, direct: bool = True) -> tuple[int, int]:
    """`torch.save(obj, path)` through a `DirectFile` (fsync'ed on return); returns the file's (size, CRC-32)."""
    with DirectFile(path, direct) as f:
        torch.save(obj, f)
    return f.size, f.crc32


def save_safetensors(
    tensors: dict[str, torch.Tensor],
    path: str | os.PathLike,
    metadata: dict[str, str] | None = None,
    direct: bool = True,
) -> tuple[int, int]:
    """Write `tensors` (CPU, contiguous or not) as a safetensors file through a `DirectFile` (fsync'ed on return);
    returns the file's (size, CRC-32).
    The header lists the tensors with their [begin, end) byte offsets into the data that follows, ordered as the
    library orders them (by dtype, last in the format's enumeration first, then by name): the file is byte for byte
    what safetensors' `save_file` writes (tested). A dtype it does not list (unsigned 16-64 bit, float8, complex) or
    a big-endian machine: the library's `save_file` writes the file instead, then it is fsync'ed."""
    if sys.byteorder != "little" or any(t.dtype not in SAFETENSORS_DTYPES for t in tensors.values()):
        from safetensors.torch import save_file  # the library's own writer (through the page cache)

        save_file({k: v.contiguous() for k, v in tensors.items()}, str(path), metadata=metadata)
        fsync_path(path)
        return file_crc32(path)
    header: dict[str, Any] = {"__metadata__": metadata} if metadata else {}
    names, offset = sorted(tensors, key=lambda n: (-_DTYPE_RANK[tensors[n].dtype], n)), 0
    for name in names:
        t = tensors[name]
        nbytes = t.numel() * t.element_size()
        header[name] = {
            "dtype": SAFETENSORS_DTYPES[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
    encoded = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    encoded += b" " * (-len(encoded) % 8)
    with DirectFile(path, direct) as f:
        f.write(struct.pack("<Q", len(encoded)))
        f.write(encoded)
        for name in names:
            t = tensors[name].detach().cpu().contiguous()
            f.write(t.view(-1).view(torch.uint8).numpy() if t.numel() else b"")
    return f.size, f.crc32


def file_crc32(path: str | os.PathLike) -> tuple[int, int]:
    """(size in bytes, zlib CRC-32) of a file's content, read in 4 MiB pieces.

    >>> import tempfile; p = Path(tempfile.mkdtemp()) / "x"; _ = p.write_bytes(b"123456789")
    >>> file_crc32(p)[0], hex(file_crc32(p)[1])
    (9, '0xcbf43926')
    """
    size, crc = 0, 0
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(4 << 20), b""):
            crc = zlib.crc32(chunk, crc)
            size += len(chunk)
    return size, crc


def fsync_path(path: str | os.PathLike) -> None:
    """Flush a file's (or a directory's entries') data to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
