"""Checks on the files and directories a command reads and writes, made before any work, and
writes that cannot leave half a file behind.

A directory given where a file goes, a missing parent or a read-only place should cost the user
a one-line error at once — not a traceback after a long conversion, nor an output written
before the report next to it fails. Whether a place is writable is found out by creating a
temporary file there (``os.access`` says yes to root on read-only mounts and /proc).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from .errors import KilnError


class PathError(KilnError, OSError):
    """A path a command reads or writes is missing, of the wrong kind, or not writable."""


def _fail(what: str, path, why: str) -> PathError:
    return PathError(f"{what} {os.fspath(path)!r}: {why}")


def readable_file(path, what: str) -> Path:
    """``path`` as a Path: an existing file that can be opened for reading."""
    p = Path(path)
    if p.is_dir():
        why = "it is a directory, not a file"
    elif not p.exists():
        why = "no such file"
    else:
        try:
            with open(p, "rb"):
                return p
        except OSError as exc:
            why = exc.strerror
    raise PathError(f"{what}: cannot read {os.fspath(p)!r}: {why}")


def readable_dir(path, what: str) -> Path:
    """``path`` as a Path: an existing directory."""
    p = Path(path)
    if not p.exists():
        raise _fail(what, p, "no such directory")
    if not p.is_dir():
        raise _fail(what, p, "is a file, not a directory")
    return p


def _existing_ancestor(p: Path) -> Path:
    """The nearest ancestor of ``p`` that exists (``p``'s parent directories are made on writing)."""
    for parent in (p.absolute()).parents:
        if parent.exists():
            return parent
    return Path(p.absolute().anchor)


def _probe_directory(directory: Path, what: str, path) -> None:
    """Raise unless a file can be created in ``directory`` (which exists)."""
    if not directory.is_dir():
        raise _fail(what, path, f"{str(directory)!r} is a file, so nothing can be created under it")
    try:
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as exc:
        raise _fail(what, path, f"cannot create files in {str(directory)!r} ({exc.strerror})") from None


def writable_file(path, what: str) -> Path:
    """``path`` as a Path, checked writable before any work: not a directory, an existing file
    openable for writing (left unchanged here), or a new one whose missing parent directories
    can be made."""
    p = Path(path)
    if p.is_dir():
        raise _fail(what, p, "is a directory; give a file path")
    if p.exists():
        try:
            with open(p, "r+b"):
                pass
        except OSError as exc:
            raise _fail(what, p, f"cannot be written ({exc.strerror})") from None
        return p
    _probe_directory(_existing_ancestor(p), what, p)
    return p


def writable_dir(path, what: str, *, empty: bool = False, make_parents: bool = True) -> Path:
    """``path`` as a Path, checked before any work: an existing directory files can be created in
    (and, with ``empty``, holding nothing), or a new one that can be made (with ``make_parents``
    False, its parent must exist)."""
    p = Path(path)
    if p.exists():
        if not p.is_dir():
            raise _fail(what, p, "is a file, not a directory")
        if empty and any(p.iterdir()):
            raise _fail(what, p, "already exists and is not empty")
        _probe_directory(p, what, p)
        return p
    parent = p.absolute().parent
    if not make_parents and not parent.is_dir():
        raise _fail(what, p, f"its parent directory {str(parent)!r} does not exist")
    _probe_directory(_existing_ancestor(p), what, p)
    return p


def write_bytes(path, data: bytes, what: str) -> Path:
    """Write ``data`` to ``path``, making missing parent directories. The bytes go to a temporary
    file next to it, renamed over ``path`` when complete: an interrupted or failed write never
    leaves a truncated model, and the old file stays until the new one is whole."""
    p = Path(path)
    try:
        if p.exists() and not p.is_file():  # a device or pipe (/dev/stdout): written in place
            with open(p, "wb") as f:
                f.write(data)
            return p
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
        try:
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, p)
        finally:
            if tmp.exists():
                tmp.unlink()
    except OSError as exc:
        raise _fail(what, p, f"cannot be written ({exc.strerror or exc})") from None
    return p


def write_text(path, text: str, what: str) -> Path:
    """`write_bytes` for UTF-8 text."""
    return write_bytes(path, text.encode("utf-8"), what)


def read_npy(path, what: str):
    """The array in a NumPy ``.npy`` file (``np.save``'s format), or a one-line error saying what
    the file is instead (an .npz archive, text, a pickle) — never NumPy's "pickled data" guess."""
    import numpy as np

    p = readable_file(path, what)
    with open(p, "rb") as f:
        head = f.read(6)
    if head != b"\x93NUMPY":
        kind = ("an .npz archive (several arrays); give one array per .npy file" if head.startswith(b"PK") else
                "not a .npy file (np.save's format; text, CSV or pickles are not read)")
        raise _fail(what, p, kind)
    try:
        return np.load(p, allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise _fail(what, p, f"cannot be read as .npy ({exc})") from None
