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

from meshplan.errors import SpecError

MAX_SPEC_BYTES = 1 << 20
"""The largest spec file (model, cluster, accelerator, job: TOML or JSON) meshplan reads: 1 MiB, some
hundred times the largest real one."""
MAX_DATA_BYTES = 64 << 20
"""The largest data file meshplan reads (a profile, a published-runs CSV, a framework config): 64 MiB."""

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


def read_input_text(path: str | os.PathLike[str], field: str, *, max_bytes: int = MAX_SPEC_BYTES,
                    kind: str = "file") -> str:
    """The UTF-8 text of an input file, or SpecError naming ``field``: not found, not a regular file,
    larger than ``max_bytes``, unreadable, or not UTF-8. The size is checked before anything is read."""
    p = Path(path)
    if not p.is_file():
        state = "is a folder" if p.is_dir() else "is not a regular file" if p.exists() else "not found"
        raise SpecError(field, f"{kind} {str(path)!r} {state}")
    try:
        size = p.stat().st_size
        if size > max_bytes:
            raise SpecError(field, f"{kind} {str(path)!r} is {size:,} bytes; at most {max_bytes:,} are read")
        with p.open("rb") as fh:
            data = fh.read(max_bytes + 1)
    except OSError as exc:
        raise SpecError(field, f"{kind} {str(path)!r} cannot be read ({_reason(exc)})") from None
    if len(data) > max_bytes:  # grew while it was read
        raise SpecError(field, f"{kind} {str(path)!r} is over {max_bytes:,} bytes; at most that many are read")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(field, f"{kind} {str(path)!r} is not UTF-8 text: {exc.reason} at byte {exc.start}") from None
