"""Where a command will write, checked before the work that writes there (``--logs``, ``--output``); JSON
written whole or not at all (`write_json`); shard patterns expanded with their backslashes kept; how a
committed result names a path (`shown_path`, `shown_text`: never a path of the machine it ran on).

Writability is tested by creating a file: permission bits say nothing for root, nor for a read-only mount.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import tempfile
from pathlib import Path
from typing import Iterable, Optional

#: The errors of a write the disk refuses (full, or over quota) and of one the folder refuses (read-only, denied):
#: each command says them in one line with the fix, and lets any other error through.
DISK_FULL = (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC))
NOT_WRITABLE = (errno.EROFS, errno.EACCES, errno.EPERM)

#: the repository's root: a result names a path inside it relative to this folder
REPO = Path(__file__).resolve().parents[1]
#: what a result writes for the folders above a path outside the repository (docs/studies.md, "Paths in results")
OUTSIDE = "$OUTSIDE"
#: an absolute path in a text: a slash after no name, dot, tilde, dash, slash or backslash, and no second slash
#: after it (a URL's ``//``), then everything up to a space, a quote or a backtick
_ABSOLUTE_IN_TEXT = re.compile(r"(?<![\w.~/\\-])/(?![/\s])[^\s'\"`]*")


def current_umask() -> int:
    """The process's umask, read without setting it where the kernel says it (setting it, even to restore it at
    once, is process-wide: another thread's file would get the wrong mode meanwhile)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _try_write(folder: Path) -> Optional[str]:
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        return f"cannot write in {str(folder)!r} ({e.strerror or e})"
    return None


def folder_problem(folder: str | os.PathLike) -> Optional[str]:
    """Why files cannot be written under ``folder`` (created if missing: the nearest of its parents that
    exists must be a folder one can write in), or None when they can."""
    path = Path(os.path.abspath(folder))
    for candidate in (path, *path.parents):
        if candidate.exists():
            if not candidate.is_dir():
                what = "" if candidate == path else f" (so {str(path)!r} cannot be created)"
                return f"{str(candidate)!r} is a file, not a folder{what}"
            return _try_write(candidate)
    return None  # pragma: no cover (the root exists)


def output_file_problem(path: str | os.PathLike) -> Optional[str]:
    """Why ``path`` cannot be written as a file (its folders created if missing), or None when it can."""
    target = Path(path)
    if target.is_dir():
        return f"{str(target)!r} is a folder; give a file name (e.g. {str(target / 'results.json')!r})"
    if target.exists():
        try:
            with open(target, "ab"):  # opened for appending and closed: the file is not changed
                pass
        except OSError as e:
            return f"cannot write {str(target)!r} ({e.strerror or e})"
        return None
    return folder_problem(target.parent if str(target.parent) else ".")


def expand_pattern(pattern: str) -> list:
    """The paths of a shard pattern (``train/{00000..00007}.tar``, several joined by ``::``), in order. A
    backslash is part of a path here, never an escape (``back\\slash/0.tar`` stays as written)."""
    import braceexpand

    return [path for part in str(pattern).split("::") for path in braceexpand.braceexpand(part, escape=False)]


def expand_sources(pattern: str, weights: Optional[str] = None) -> tuple:
    """``(paths, weights)``: :func:`expand_pattern`'s paths of ``::``-joined sources, each path with its source's
    weight (``weights`` ``::``-joined as ``--train-data-upsampling-factors``; None without), the pairing of
    OpenCLIP's ``expand_urls``, whose brace expansion would drop a backslash."""
    parts = str(pattern).split("::")
    paths = [expand_pattern(part) for part in parts]
    flat = [path for group in paths for path in group]
    if weights is None:
        return flat, None
    factors = [float(w) for w in str(weights).split("::")]
    if len(factors) != len(parts):
        raise ValueError(f"{len(parts)} data sources but {len(factors)} upsampling factors ({weights!r})")
    return flat, [w for group, w in zip(paths, factors) for _ in group]


def write_json(path: str | os.PathLike, doc, *, indent: Optional[int] = 1, **dumps) -> Path:
    """Write ``doc`` as JSON into ``path`` whole or not at all: into a temporary file beside it, then renamed over
    it, so that a stop or a full disk mid-write leaves the earlier file (or none), never a cut one. ``dumps``:
    `json.dumps`' other options. Returns ``path``."""
    import json

    path = Path(path)
    data = (json.dumps(doc, indent=indent, **dumps) + "\n").encode()
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
        os.close(fd)
        fd = -1
        os.chmod(tmp, 0o666 & ~current_umask())  # what a plain open(path, "w") gives (mkstemp's is 0600)
        os.replace(tmp, path)
    except BaseException as e:
        if fd >= 0:
            os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(e, OSError) and e.filename is None:  # os.write names no file: name the one being written
            raise OSError(e.errno, e.strerror, str(path)) from None
        raise
    return path


def _forms(folder: os.PathLike) -> list:
    """``folder`` absolute as given and with its links resolved, the longer first."""
    forms = {os.path.abspath(folder).rstrip(os.sep), str(Path(folder).resolve()).rstrip(os.sep)}
    return sorted(forms, key=len, reverse=True)


def _under(text: str, prefix: str) -> Optional[str]:
    """The part of path ``text`` below folder ``prefix`` (``""`` for the folder itself), or None."""
    if text == prefix:
        return ""
    return text[len(prefix) + 1 :] if prefix and text.startswith(prefix + os.sep) else None


def shown_path(path: str | os.PathLike, folders: Iterable = (), repo: os.PathLike = REPO) -> str:
    """How a committed result names ``path``: inside the repository, relative to its root; outside it,
    ``$OUTSIDE/`` and the path from the outermost of ``folders`` (a ``--work`` folder) that holds it, that folder's
    name first, else its last part alone. A relative path, and ``/`` alone, are kept."""
    text = os.fspath(path)
    if not text.startswith("/") or not text.strip("/"):
        return text
    for prefix in _forms(repo):
        rest = _under(text, prefix)
        if rest is not None:
            return rest or "."
    for prefix in sorted((form for folder in folders for form in _forms(folder)), key=len):
        rest = _under(text, prefix)
        if rest is not None:
            shown = f"{OUTSIDE}/{os.path.basename(prefix)}"
            return f"{shown}/{rest}" if rest else shown
    return f"{OUTSIDE}/{os.path.basename(text.rstrip(os.sep))}"


def shown_text(text: str, folders: Iterable = (), repo: os.PathLike = REPO) -> str:
    """``text`` (a command line, a log line) with each absolute path in it as :func:`shown_path` writes it."""
    folders = list(folders)
    return _ABSOLUTE_IN_TEXT.sub(lambda m: shown_path(m.group(0), folders, repo), text)
