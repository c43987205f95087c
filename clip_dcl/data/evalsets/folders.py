"""ImageFolder trees, their class names tied to the folders, and ImageNet's synset folders."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Sequence

from .files import IMAGE_EXTENSIONS, read_classnames

_SYNSET = re.compile(r"^n\d{8}$")


def scan_image_folder(
    root: str | os.PathLike, class_to_idx: dict[str, int] | None = None, allow_empty: bool = False
) -> tuple[list[str], list[tuple[str, int]]]:
    """(sorted class folders, [(image path, label)]) of ``root/<class>/<image>``; ``ValueError`` for an empty class
    folder, or one outside ``class_to_idx`` when given."""
    from torchvision.datasets.folder import find_classes, make_dataset

    root = Path(root).absolute()
    if not root.is_dir():
        raise ValueError(f"image folder {str(root)!r} does not exist")
    try:  # both torchvision calls raise FileNotFoundError for an empty tree or class folder
        classes, found = find_classes(root)
        if class_to_idx is None:
            class_to_idx = found
        else:
            unknown = sorted(set(classes) - set(class_to_idx))
            if unknown:
                raise ValueError(f"image folder {str(root)!r} has class folders {unknown} absent from the train split")
            classes = sorted(class_to_idx, key=class_to_idx.get)
        samples = make_dataset(str(root), class_to_idx, extensions=IMAGE_EXTENSIONS, allow_empty=allow_empty)
    except FileNotFoundError as e:
        raise ValueError(f"image folder {str(root)!r}: {e}") from e
    return classes, samples


def is_imagenet_synsets(folders: Sequence[str]) -> bool:
    """True when every folder name is a WordNet synset id (``n01440764``)."""
    return bool(folders) and all(_SYNSET.match(f) for f in folders)


def imagenet_classnames_for(folders: Sequence[str]) -> list[str]:
    """OpenCLIP's ImageNet class names for the 1000 sorted synset folders; fewer are ambiguous (OpenCLIP ships no
    synset list): ``ValueError``."""
    from open_clip.zero_shot_metadata import IMAGENET_CLASSNAMES

    if not is_imagenet_synsets(folders):
        raise ValueError("folder names are not ImageNet synset ids (nXXXXXXXX)")
    if len(folders) != len(IMAGENET_CLASSNAMES) or len(set(folders)) != len(folders):
        raise ValueError(
            f"found {len(folders)} synset folders; ImageNet class names need all {len(IMAGENET_CLASSNAMES)} "
            f"(sorted synsets = label order). Give a class-name file for a subset."
        )
    if list(folders) != sorted(folders):
        raise ValueError("synset folders must be given in sorted order")
    return list(IMAGENET_CLASSNAMES)


#: The files of a tree's own class names, in the order they are looked for.
CLASSNAME_FILES = ("classnames.json", "classnames.txt")


def load_classnames(path: str | os.PathLike) -> list[str] | dict[str, str]:
    """A class-name file: a JSON mapping ``{"folder": "class name"}``, a JSON list, or one name a line."""
    import json

    path = Path(path)
    if path.suffix.lower() != ".json":
        return read_classnames(path)
    if not path.is_file():
        raise ValueError(f"class-name file {str(path)!r} does not exist")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"class-name file {str(path)!r} is not valid JSON: {e}") from None
    if isinstance(doc, dict) and all(isinstance(k, str) and isinstance(v, str) and v.strip() for k, v in doc.items()):
        return {k: v.strip() for k, v in doc.items()}
    if isinstance(doc, list) and all(isinstance(v, str) and v.strip() for v in doc):
        return [v.strip() for v in doc]
    raise ValueError(
        f"class-name file {str(path)!r} must hold a JSON object mapping each class folder to its "
        f'name ({{"n01440764": "tench", ...}}), or a list of names'
    )


def _words(text: str) -> list[str]:
    return re.findall(r"[0-9a-z]+", text.lower())


def names_folder(name: str, folder: str) -> bool:
    """Whether ``name``'s words run, in order, inside ``folder``'s (``golden retriever``, ``003_golden-retriever``)."""
    words, held = _words(name), _words(folder)
    return bool(words) and any(held[i : i + len(words)] == words for i in range(len(held) - len(words) + 1))


def _mapping_example(folders: Sequence[str]) -> str:
    return "{" + ", ".join(f'"{f}": "..."' for f in folders[:2]) + (", ..." if len(folders) > 2 else "") + "}"


def checked_name_list(names: Sequence[str], folders: Sequence[str], source: str, root: str | os.PathLike) -> list[str]:
    """``names`` once line i names the i-th sorted folder, else ``ValueError`` (a list in another order would score
    every image against the wrong name)."""
    names = list(names)
    if len(names) != len(folders):
        raise ValueError(
            f"class names from {source} count {len(names)}, but {str(root)!r} has {len(folders)} class folders"
        )
    if is_imagenet_synsets(folders) and len(folders) == 1000 and names == imagenet_classnames_for(folders):
        return names
    json_file = Path(root) / CLASSNAME_FILES[0]
    for i, (name, folder) in enumerate(zip(names, folders)):
        if names_folder(name, folder):
            continue
        elsewhere = [f for f in folders if names_folder(name, f)]
        if elsewhere:
            raise ValueError(
                f"class names from {source} are not in sorted folder order: line {i + 1}, {name!r}, names folder "
                f"{elsewhere[0]!r}, but label {i} is folder {folder!r}; sort the lines by folder name, or write "
                f"{str(json_file)!r} mapping each folder to its name ({_mapping_example(folders)})"
            )
        raise ValueError(
            f"class names from {source}: line {i + 1}, {name!r}, does not name folder {folder!r} (label {i} in "
            f"sorted folder order), so the order of the names cannot be checked against the folders; write "
            f"{str(json_file)!r} mapping each folder to its name ({_mapping_example(folders)}), or pass that file "
            f"as the class names"
        )
    return names


def mapped_names(mapping: dict[str, str], folders: Sequence[str], source: str, root: str | os.PathLike) -> list[str]:
    """The names of ``folders`` from a ``{folder: name}`` mapping that names each exactly once (else ``ValueError``)."""
    missing = [f for f in folders if f not in mapping]
    unknown = sorted(set(mapping) - set(folders))
    if missing or unknown:
        parts = []
        if missing:
            parts.append(f"no name for the folder(s) {missing[:5]}" + (" ..." if len(missing) > 5 else ""))
        if unknown:
            parts.append(f"names for {unknown[:5]}{' ...' if len(unknown) > 5 else ''} that are not class folders")
        raise ValueError(
            f"class names from {source} do not match the class folders of {str(root)!r}: " + "; ".join(parts)
        )
    return [mapping[f] for f in folders]


def folder_classnames(
    root: str | os.PathLike, folders: Sequence[str], classnames: Sequence[str] | dict | str | os.PathLike | None = None
) -> tuple[list[str], str]:
    """(class names in label order, their source) for ``root``'s sorted class ``folders``: ``classnames``, else
    `CLASSNAME_FILES`, else ImageNet's for synset folders, else the folder names, ``_`` read as a space; each name
    tied to its folder (``ValueError`` otherwise)."""
    if classnames is None:
        found = next((Path(root) / n for n in CLASSNAME_FILES if (Path(root) / n).is_file()), None)
        if found is None:
            if is_imagenet_synsets(folders):
                return imagenet_classnames_for(folders), "open_clip IMAGENET_CLASSNAMES"
            return [f.replace("_", " ").strip() or f for f in folders], "the folder names"
        classnames = found
    if isinstance(classnames, (str, os.PathLike)):
        names, source = load_classnames(classnames), str(classnames)
    else:
        names, source = (dict(classnames) if isinstance(classnames, dict) else list(classnames)), "argument"
    if isinstance(names, dict):
        return mapped_names(names, folders, source, root), source
    return checked_name_list(names, folders, source, root), source
