"""Text files, images as paths or zip members read in place, and folder listings for the evaluation readers."""

from __future__ import annotations

import io
import json
import os
import zipfile
from pathlib import Path
from typing import Callable, Sequence

from torch.utils.data import Dataset

from ..skips import Skip

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def read_lines(path: str | os.PathLike, what: str = "file") -> list[str]:
    """Non-empty, stripped lines of a UTF-8 text file; ``ValueError`` naming it if missing or empty."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{what} {str(path)!r} does not exist")
    lines = [ln.strip() for ln in path.read_text(encoding="utf-8").splitlines()]
    lines = [ln for ln in lines if ln]
    if not lines:
        raise ValueError(f"{what} {str(path)!r} is empty")
    return lines


def read_classnames(path: str | os.PathLike) -> list[str]:
    """One class name per line (line i = label i)."""
    return read_lines(path, "class-name file")


def template_problem(template: str) -> str | None:
    """Why a template cannot be filled with ``str.format`` at ``{c}`` or ``{}``, or None when it can."""
    import string

    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(template.replace("{c}", "{}")) if f is not None]
    except ValueError as e:
        return f"{template!r} is not a format string ({e}; write a literal brace as {{{{ or }}}})"
    others = sorted({f for f in fields if f not in ("", "0")})
    if others:
        named = ", ".join("{" + f + "}" for f in others)
        return f"{template!r} has the placeholder(s) {named}; a template takes only {{c}} (or {{}}) for the class name"
    if not fields:
        return f"{template!r} has no '{{c}}' placeholder"
    return None


def read_templates(path: str | os.PathLike) -> list[str] | dict[str, list[str]]:
    """Prompt templates from a text file (one a line) or JSON (a list, or CuPL's ``{"class name": [prompts]}``);
    text templates come back with ``{}`` for ``{c}``, bad ones raise ``ValueError``."""
    path = Path(path)
    if path.suffix.lower() == ".json":
        if not path.is_file():
            raise ValueError(f"template file {str(path)!r} does not exist")
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise ValueError(f"template file {str(path)!r} is not valid JSON: {e}") from e
        if isinstance(doc, dict):
            bad = [
                k
                for k, v in doc.items()
                if not isinstance(v, list) or not v or not all(isinstance(p, str) and p.strip() for p in v)
            ]
            if not doc or bad:
                raise ValueError(
                    f"template file {str(path)!r}: per-class prompts must map each class name to a "
                    f"non-empty list of strings; bad entries: {bad[:5]}"
                )
            return {k: [p.strip() for p in v] for k, v in doc.items()}
        if not isinstance(doc, list) or not all(isinstance(t, str) for t in doc):
            raise ValueError(
                f"template file {str(path)!r} must hold a list of templates or an object class name -> list of prompts"
            )
        lines = [t.strip() for t in doc if t.strip()]
        if not lines:
            raise ValueError(f"template file {str(path)!r} is empty")
    else:
        lines = read_lines(path, "template file")
    out = []
    for i, line in enumerate(lines, 1):
        problem = template_problem(line)
        if problem:
            raise ValueError(f"template file {str(path)!r} line {i}: {problem}")
        out.append(line.replace("{c}", "{}"))
    return out


def split_zip_ref(ref: str) -> tuple[str, str] | None:
    """``'train.zip@a/b.png'`` -> ``('train.zip', 'a/b.png')``; ``None`` for a plain path."""
    if "@" not in ref:
        return None
    zip_part, member = ref.split("@", 1)
    if not zip_part.lower().endswith(".zip"):
        return None
    return zip_part, member


class ImageSource:
    """Opens images given as paths relative to ``base_dir`` or as ``zipname@member``; zip handles are cached per
    process (dropped after a fork, so workers share no file offset)."""

    def __init__(self, base_dir: str | os.PathLike):
        self.base_dir = Path(base_dir)
        self._zips: dict[str, zipfile.ZipFile] = {}
        self._pid = os.getpid()

    def __getstate__(self):
        return {"base_dir": self.base_dir}

    def __setstate__(self, state):
        self.__init__(state["base_dir"])

    def _zip(self, name: str) -> zipfile.ZipFile:
        if os.getpid() != self._pid:
            self._zips, self._pid = {}, os.getpid()
        zf = self._zips.get(name)
        if zf is None:
            zf = self._zips[name] = zipfile.ZipFile(self.base_dir / name)
        return zf

    def open(self, ref: str):
        """The image as an RGB ``PIL.Image``."""
        from PIL import Image

        parts = split_zip_ref(ref)
        if parts is None:
            data = (self.base_dir / ref).read_bytes()
        else:
            data = self._zip(parts[0]).read(parts[1])
        return Image.open(io.BytesIO(data)).convert("RGB")

    def check(self, refs: Sequence[str], what: str) -> None:
        """Raise ``ValueError`` naming the first reference in ``refs`` that cannot be found."""
        members: dict[str, set] = {}
        for ref in refs:
            parts = split_zip_ref(ref)
            if parts is None:
                if not (self.base_dir / ref).is_file():
                    raise ValueError(f"{what}: image {str(self.base_dir / ref)!r} does not exist")
                continue
            zname, member = parts
            if zname not in members:
                zpath = self.base_dir / zname
                if not zpath.is_file():
                    raise ValueError(f"{what}: zip file {str(zpath)!r} does not exist (referenced as {ref!r})")
                try:
                    with zipfile.ZipFile(zpath) as zf:
                        members[zname] = set(zf.namelist())
                except zipfile.BadZipFile as e:
                    raise ValueError(f"{what}: {str(zpath)!r} is not a valid zip file: {e}") from e
            if member not in members[zname]:
                raise ValueError(f"{what}: {member!r} is not in zip file {str(self.base_dir / zname)!r}")


class ImageListDataset(Dataset):
    """``dataset[i] -> (transform(image_i), i)``; with ``markers``, an undecodable image gives ``(Skip, i)``."""

    def __init__(
        self,
        refs: Sequence[str],
        source: ImageSource,
        transform: Callable,
        markers: bool = False,
        where: str | None = None,
    ):
        self.refs = list(refs)
        self.source = source
        self.transform = transform
        self.markers = markers
        self.where = where or str(source.base_dir)

    def __len__(self) -> int:
        return len(self.refs)

    def __getitem__(self, i: int):
        if not self.markers:
            return self.transform(self.source.open(self.refs[i])), i
        try:
            image = self.source.open(self.refs[i])
        except Exception as e:  # noqa: BLE001 - what PIL (or a zip member) raises on a bad file varies
            return Skip(self.where, self.refs[i], "undecodable image", f"{type(e).__name__}: {e}"), i
        return self.transform(image), i


def describe_folder(path: str | os.PathLike, limit: int = 8) -> str:
    """A short listing of a folder's entries for error messages."""
    path = Path(path)
    if not path.exists():
        return "nothing (it does not exist)"
    if not path.is_dir():
        return "a file, not a folder"
    names = sorted(p.name + ("/" if p.is_dir() else "") for p in path.iterdir())
    if not names:
        return "an empty folder"
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more
