"""Atomic file writes: every file hybridrank writes appears whole or not at all.

One mechanism for checkpoints, score exports, simulated logs, ``metrics.json``, reports and
portable models: write to a hidden temporary file in the destination directory, flush it to disk,
move it onto the destination with ``os.replace`` (atomic within one file system), then flush the
directory entry. A reader sees either the previous file or the complete new one; an exception at
any point removes the temporary file and leaves the previous file untouched.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["atomic_path", "check_writable", "write_text", "write_json"]


def check_writable(path: str | os.PathLike) -> Path:
    """Create the parent directory if needed and check a file can be written at ``path``.

    Raises:
        ValueError: ``path`` is a directory, or its directory cannot be created or written.
    """
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"output path {str(path)!r} is a directory; give a file name")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"output path {str(path)!r} is not writable: cannot create its directory "
                         f"({e.strerror})") from None
    denied = path.exists() and not os.access(path, os.W_OK)
    if denied or not os.access(path.parent, os.W_OK | os.X_OK):
        raise ValueError(f"output path {str(path)!r} is not writable (no write permission on "
                         f"{str(path.parent)!r})")
    return path


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; when the block succeeds, move it onto ``path``.

    The body writes the temporary file however it likes (``torch.save``, a parquet writer, ...).
    The file is fsynced before the move and the directory after it; permissions follow the umask
    (``mkstemp`` files are private, outputs are meant to be read).

    >>> d = Path(tempfile.mkdtemp())
    >>> with atomic_path(d / "x.txt") as tmp:
    ...     _ = tmp.write_text("hello")
    >>> (d / "x.txt").read_text(), sorted(p.name for p in d.iterdir())
    ('hello', ['x.txt'])
    """
    path = check_writable(path)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def _fsync_dir(directory: Path) -> None:
    """Make a rename durable (POSIX); a no-op where directories cannot be opened."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` atomically; returns the path."""
    with atomic_path(path) as tmp:
        tmp.write_text(text)
    return Path(path)


def write_json(path: str | os.PathLike, obj: Any, *, indent: int = 2) -> Path:
    """Write ``obj`` as JSON to ``path`` atomically (non-JSON values through ``str``)."""
    return write_text(path, json.dumps(obj, indent=indent, default=str))
