"""A folder of class folders (ImageFolder's layout, ``SRC/<class>/<image>``) given to ``clip-dcl data shards``: its
images become training pairs captioned with their class name, and the held-out ones also a zero-shot set in the
layout ``clip-dcl eval zeroshot`` reads (``OUT/zeroshot/<class>/<image>``, ``classnames.txt``, ``templates.txt``).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

from .evalsets.files import IMAGE_EXTENSIONS
from .evalsets.folders import CLASSNAME_FILES, folder_classnames, names_folder, scan_image_folder

#: The caption of an image that has only its class: one prompt, so that every image of a class reads the same.
CAPTION = "a photo of a {c}."


def readable_classname(folder: str) -> str:
    """A class folder's name as words: ``_``, ``-`` and ``.`` read as spaces and a leading number dropped
    (``003.golden_retriever`` -> ``golden retriever``)."""
    words = " ".join(re.sub(r"[_\-.]", " ", folder).split())
    return re.sub(r"^\d+ ", "", words) or words or folder


def class_tree(folder) -> tuple[list, dict] | None:
    """``([(image path, class folder)], {class folder: class name})`` when ``folder`` is a tree of class folders with
    no caption in it: no image at its top, images in two or more of its folders (torchvision's ImageFolder rules),
    no ``.txt`` below its top; else None. Names: the tree's own class-name file, else `readable_classname`."""
    root = Path(folder)
    top = [p for p in root.iterdir() if p.is_file()]
    if any(p.suffix.lower() in IMAGE_EXTENSIONS for p in top):
        return None
    if any(p.is_file() for d in root.iterdir() if d.is_dir() for p in d.rglob("*.txt")):
        return None  # captions beside the images: image-caption pairs in sub-folders
    try:
        classes, samples = scan_image_folder(root, allow_empty=True)
    except ValueError:
        return None
    used = sorted({classes[label] for _, label in samples})
    if len(used) < 2:
        return None
    if any((root / name).is_file() for name in CLASSNAME_FILES):
        names = dict(zip(used, folder_classnames(root, used)[0]))
    else:
        names = {c: readable_classname(c) for c in used}
    return [(Path(path), classes[label]) for path, label in samples], names


class ZeroshotTree:
    """The zero-shot set written beside the shards: each held-out image under its class folder, then
    ``classnames.txt`` (one name a line, sorted folder order), ``classnames.json`` where a name does not spell its
    folder (``eval zeroshot`` checks each line against its folder) and ``templates.txt`` (OpenCLIP's 80 prompts)."""

    def __init__(self, folder, names: dict):
        self.folder, self.names, self.counts = Path(folder), names, Counter()

    def add(self, label: str, key: str, ext: str, data: bytes) -> None:
        path = self.folder / label / f"{key}.{ext}"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        self.counts[label] += 1

    def finish(self) -> dict | None:
        """Write the class names and templates; the summary's ``zeroshot`` entry (None when no image was held out)."""
        from open_clip.zero_shot_metadata import OPENAI_IMAGENET_TEMPLATES

        if not self.counts:
            return None
        folders = sorted(self.counts)
        names = [self.names[f] for f in folders]
        (self.folder / "classnames.txt").write_text("".join(n + "\n" for n in names))
        if not all(names_folder(n, f) for n, f in zip(names, folders)):
            (self.folder / "classnames.json").write_text(json.dumps(dict(zip(folders, names)), indent=1) + "\n")
        (self.folder / "templates.txt").write_text("".join(t("{c}") + "\n" for t in OPENAI_IMAGENET_TEMPLATES))
        return {
            "folder": str(self.folder),
            "images": sum(self.counts.values()),
            "classes": len(folders),
            "left_out": sorted(set(self.names) - set(folders)),  # classes with no held-out image
        }
