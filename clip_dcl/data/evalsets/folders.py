"""ImageFolder trees (``ROOT/<class>/<image>``, zero-shot sets and few-shot train/test pairs) and
ImageNet's synset folders with OpenCLIP's class names."""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Sequence

from .files import IMAGE_EXTENSIONS

_SYNSET = re.compile(r"^n\d{8}$")



def scan_image_folder(root: str | os.PathLike, class_to_idx: dict[str, int] | None = None,
                      allow_empty: bool = False) -> tuple[list[str], list[tuple[str, int]]]:
    """(sorted class folders, [(absolute image path, label)]) of ``root/<class>/<image>``.

    Image files are those with an extension in :data:`IMAGE_EXTENSIONS`; a class folder without
    any raises ``ValueError`` unless ``allow_empty``.

    With ``class_to_idx`` given (a test split scanned with the train split's classes), folders
    of unknown classes raise ``ValueError``.
    """
    from torchvision.datasets.folder import find_classes, make_dataset

    root = Path(root).absolute()
    if not root.is_dir():
        raise ValueError(f"image folder {str(root)!r} does not exist")
    try:
        classes, found = find_classes(root)
    except FileNotFoundError as e:
        raise ValueError(f"image folder {str(root)!r}: {e}") from e
    if class_to_idx is None:
        class_to_idx = found
    else:
        unknown = sorted(set(classes) - set(class_to_idx))
        if unknown:
            raise ValueError(f"image folder {str(root)!r} has class folders {unknown} absent from the train split")
        classes = sorted(class_to_idx, key=class_to_idx.get)
    try:
        samples = make_dataset(str(root), class_to_idx, extensions=IMAGE_EXTENSIONS, allow_empty=allow_empty)
    except FileNotFoundError as e:
        raise ValueError(f"image folder {str(root)!r}: {e}") from e
    return classes, samples


def is_imagenet_synsets(folders: Sequence[str]) -> bool:
    """True when every folder name is a WordNet synset id (``n01440764``)."""
    return bool(folders) and all(_SYNSET.match(f) for f in folders)


def imagenet_classnames_for(folders: Sequence[str]) -> list[str]:
    """OpenCLIP's ImageNet class names for the 1000 synset folders, in sorted-synset order.

    The standard ImageNet label order is the sorted list of the 1000 synsets, and
    ``open_clip.IMAGENET_CLASSNAMES`` follows it; with fewer folders the mapping is ambiguous
    (OpenCLIP ships no synset list), so a ``ValueError`` asks for an explicit class-name file.
    """
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
