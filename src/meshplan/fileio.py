"""Files meshplan writes: whole or not at all.

Every file is written to a temporary file in the same folder and renamed over the destination
(``os.replace``, atomic on POSIX and Windows within one file system), so a full disk, a size limit, a
signal or an error half-way leaves the old file as it was and no partial file beside it. A write that
fails raises :class:`WriteError` naming the path and the reason; the CLI prints it on one line and exits 1.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import tempfile
from pathlib import Path
from typing import Any


class WriteError(OSError):
    """A file could not be written: ``path`` and the operating system's reason. The destination, if it
    existed, is unchanged."""

    def __init__(self, path: str | os.PathLike[str], reason: str) -> None:
        super().__init__(errno.EIO, reason, str(path))
        self.path = str(path)
        self.reason = reason

    def __str__(self) -> str:
        return f"{self.path}: cannot write ({self.reason}); any existing file there is unchanged"


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.errno == errno.EFBIG:
        return "file too large: the file-size limit (ulimit -f) or the file system's"
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return "no space left on the device"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror[0].lower() + exc.strerror[1:]
    return str(exc) or type(exc).__name__


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in its folder and a rename. The file keeps the
    permissions a new file gets (umask), or the old file's where one is replaced."""
    dest = Path(path)
    folder = dest.parent if str(dest.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise WriteError(dest, _reason(exc)) from None
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        try:
            mode = dest.stat().st_mode & 0o7777
        except FileNotFoundError:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
        os.chmod(tmp, mode)
        os.replace(tmp, dest)
    except BaseException as exc:  # a signal (KeyboardInterrupt) too: never leave the temporary file
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise WriteError(dest, _reason(exc)) from None
        raise


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically (atomic_write_bytes)."""
    atomic_write_bytes(path, text.encode("utf-8"))


def strict_json(obj: Any, *, indent: int | None = 2) -> str:
    """``obj`` as strict JSON: a NaN or an infinity anywhere raises ValueError rather than writing
    ``NaN`` or ``Infinity``, which JSON does not have (callers turn non-finite values into null first)."""
    return json.dumps(obj, indent=indent, allow_nan=False)


def write_json(path: str | os.PathLike[str], obj: Any, *, indent: int | None = 2) -> None:
    """Write ``obj`` to ``path`` as strict JSON (strict_json), atomically, with a final newline."""
    atomic_write_text(path, strict_json(obj, indent=indent) + "\n")
