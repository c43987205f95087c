"""A data writer's hold on its output: one writer at a time, and what an interrupted writer left is named.

``clip-dcl data synth|fashion-mnist|fashion-scenes|shards`` write a folder, ``data pack`` a file; each holds an
``flock`` on a mark (``OUT/.clip-dcl-writing``, or ``OUT.clip-dcl-writing`` beside a file) while it writes, and
removes the mark once its output is whole. A second writer is refused while the first holds it; a mark nobody
holds is the trace of a writer that was stopped or failed, and the next one names the output as unfinished.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

MARK = ".clip-dcl-writing"


class OutputBusy(RuntimeError):
    """Another writer holds the output."""


class OutputUnfinished(RuntimeError):
    """The output is what an interrupted writer left; the message says how to write it again."""


def mark_of(out: str | os.PathLike, folder: bool = True) -> Path:
    out = Path(out)
    return out / MARK if folder else out.with_name(out.name + MARK)


def state(out: str | os.PathLike, folder: bool = True) -> Optional[str]:
    """``"busy"`` while a writer holds ``out``, ``"unfinished"`` when one left it unfinished, else None."""
    mark = mark_of(out, folder)
    try:
        fd = os.open(mark, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return "busy"
    finally:
        os.close(fd)
    return "unfinished"


def _said(fd: int) -> str:
    os.lseek(fd, 0, os.SEEK_SET)
    return os.read(fd, 4096).decode(errors="replace").strip()


@contextmanager
def writing(out: str | os.PathLike, command: str, *, overwrite: bool = False, folder: bool = True):
    """Hold ``out`` for the writer ``command`` (``clip-dcl data synth``) while inside; the mark is removed when
    the block ends without an exception. Raises `OutputBusy` when another writer holds it, `OutputUnfinished`
    when an earlier writer left it unfinished and not ``overwrite`` (an `OSError` when the mark cannot be
    written: a read-only folder)."""
    out = Path(out)
    mark = mark_of(out, folder)
    created = not mark.parent.exists()
    mark.parent.mkdir(parents=True, exist_ok=True)
    while True:
        fd = os.open(mark, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            who = _said(fd)
            os.close(fd)
            raise OutputBusy(
                f"{str(out)!r} is being written by another writer ({who or 'starting'}); wait for it to end, "
                "or write elsewhere"
            ) from None
        try:
            if os.fstat(fd).st_ino == os.stat(mark).st_ino:
                break  # held; else the writer before removed this mark meanwhile: take the new one
        except FileNotFoundError:
            pass
        os.close(fd)
    try:
        earlier = _said(fd)
        if earlier and not overwrite:
            raise OutputUnfinished(
                f"{str(out)!r} is unfinished: its writer ({earlier}) was stopped or failed before the end; "
                "run the command again with --overwrite to write it afresh"
            )
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
        os.write(fd, f"{command}, pid {os.getpid()} on {socket.gethostname()}, started {stamp}\n".encode())
        os.fsync(fd)
        before = _listing(out, folder)
        try:
            yield
        except BaseException:
            if _listing(out, folder) == before:  # refused before writing anything: the output is as it was
                _restore(fd, mark, earlier)
                if created and folder:
                    with contextlib.suppress(OSError):
                        out.rmdir()
            raise
        mark.unlink()
    finally:
        os.close(fd)


def _listing(out: Path, folder: bool) -> dict:
    """What a writer changes first: the names, sizes and times of ``out``'s entries (of ``out`` for a file)."""
    entries = (p for p in out.iterdir() if p.name != MARK) if folder and out.is_dir() else [out]
    found = {}
    for path in entries:
        try:
            st = path.lstat()
        except FileNotFoundError:
            continue
        found[path.name] = (st.st_size, st.st_mtime_ns)
    return found


def _restore(fd: int, mark: Path, earlier: str) -> None:
    if not earlier:
        mark.unlink(missing_ok=True)
        return
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, (earlier + "\n").encode())
