"""Few-shot data sets: ELEVATER's download layout and iris index files, COCO json indices, folders."""

from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from .files import ImageSource, describe_folder, read_classnames, read_templates
from .folders import scan_image_folder


def parse_index_line(line: str, where: str) -> tuple[str, list[int]]:
    """``'<path> <ids>'`` -> ``(path, [ids])``, splitting on the last space (paths may hold spaces)."""
    parts = line.rsplit(" ", 1)
    if len(parts) != 2 or not parts[0].strip():
        raise ValueError(f"{where}: expected '<image_path> <label ids>', got {line!r}")
    path, ids = parts[0].strip(), parts[1].strip()
    try:
        labels = [int(x) for x in ids.split(",") if x != ""]
    except ValueError:
        raise ValueError(f"{where}: label ids {ids!r} are not comma-separated integers") from None
    return path, labels


def read_index_file(path: str | os.PathLike, num_classes: int | None = None) -> list[tuple[str, list[int]]]:
    """An iris index file as ``[(image_ref, [label ids])]`` in file order; bad ids raise ``ValueError``."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"index file {str(path)!r} does not exist")
    items = []
    for lineno, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        ref, labels = parse_index_line(line, f"index file {str(path)!r} line {lineno}")
        if num_classes is not None:
            bad = [y for y in labels if not 0 <= y < num_classes]
            if bad:
                raise ValueError(
                    f"index file {str(path)!r} line {lineno}: label ids {bad} outside "
                    f"[0, {num_classes}) (labels.txt has {num_classes} classes)"
                )
        items.append((ref, labels))
    if not items:
        raise ValueError(f"index file {str(path)!r} lists no images")
    return items


@dataclass
class FewShotData:
    """One few-shot data set: ``train``/``test`` as ``[(image_ref, [label ids])]`` in the order the sampler
    shuffles, opened through ``source``."""

    name: str
    classnames: list[str]
    train: list[tuple[str, list[int]]]
    test: list[tuple[str, list[int]]]
    source: ImageSource
    layout: str
    templates: list[str] | dict | None = None
    multilabel: bool = False
    folder: str = ""
    classnames_source: str = ""

    @property
    def num_classes(self) -> int:
        return len(self.classnames)


def read_coco_classification(path: str | os.PathLike) -> tuple[list[str], list[tuple[str, list[int]]]]:
    """A COCO-style classification index: ``(class names, [(image_ref, [ids])])``, labels the category positions in
    id order, images sorted by id as vision-datasets sorts them (a k-shot draw shuffles the toolkit's list)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"index file {str(path)!r} does not exist")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        cats = sorted(doc["categories"], key=lambda c: c["id"])
        cat_index = {c["id"]: i for i, c in enumerate(cats)}
        labels: dict = {img["id"]: [] for img in doc["images"]}
        for ann in doc.get("annotations", []):
            if ann["image_id"] not in labels:
                raise ValueError(f"annotation for unknown image id {ann['image_id']!r}")
            if ann["category_id"] not in cat_index:
                raise ValueError(f"annotation with unknown category id {ann['category_id']!r}")
            labels[ann["image_id"]].append(cat_index[ann["category_id"]])
        items = []
        for img in sorted(doc["images"], key=lambda im: im["id"]):
            ref = f"{img['zip_file']}@{img['file_name']}" if img.get("zip_file") else img["file_name"]
            items.append((ref, sorted(set(labels[img["id"]]))))
    except (KeyError, TypeError, json.JSONDecodeError, ValueError) as e:
        raise ValueError(f"index file {str(path)!r} is not a valid COCO classification file: {e!r}") from e
    if not items:
        raise ValueError(f"index file {str(path)!r} lists no images")
    return [c.get("name", str(c["id"])) for c in cats], items


#: The layouts a few-shot data set folder may have, for error messages.
FEWSHOT_LAYOUTS = (
    "the ELEVATER toolkit's download layout, ROOT/classification/<root_folder>/ with the set's own index "
    "files (e.g. classification/cifar_10_20211007/{train.txt,test.txt,labels.txt,train.zip,val.zip})",
    "one folder a data set, ROOT/<name>/ with train.txt+test.txt+labels.txt (iris index files), "
    "train.json+test.json (COCO) or train/+test/ ImageFolder trees",
)


def fewshot_layout(folder: str | os.PathLike) -> str | None:
    """``'iris'``, ``'coco'``, ``'imagefolder'``, or ``None`` (the one-folder-a-set layout)."""
    folder = Path(folder)
    if (folder / "train.txt").is_file() and (folder / "test.txt").is_file():
        return "iris"
    if (folder / "train.json").is_file() and (folder / "test.json").is_file():
        return "coco"
    if (folder / "train").is_dir() and (folder / "test").is_dir():
        return "imagefolder"
    return None


def find_toolkit_folder(root: str | os.PathLike, root_folder: str) -> Path | None:
    """A data set's folder in ELEVATER's download (the latest date of ``root_folder``), or ``None``."""
    root, rel = Path(root), Path(root_folder)
    for cand in (root / rel, root / rel.name):
        if cand.is_dir():
            return cand
    stem = rel.name.rsplit("_", 1)[0]
    for base in (root / rel.parent, root):
        hits = sorted(
            p for p in base.glob(f"{glob.escape(stem)}_*") if p.is_dir() and p.name[len(stem) + 1 :].isdigit()
        )
        if hits:
            return hits[-1]
    return None


def list_fewshot_datasets(root: str | os.PathLike, toolkit: dict[str, dict] | None = None) -> list[str]:
    """Names of the data sets under ``root``, sorted, in either layout."""
    root = Path(root)
    if not root.is_dir():
        raise ValueError(f"few-shot root {str(root)!r} does not exist")
    found = {
        name: find_toolkit_folder(root, entry["root_folder"])
        for name, entry in (toolkit or {}).items()
        if entry.get("root_folder")
    }
    found = {name: folder.resolve() for name, folder in found.items() if folder is not None}
    # a toolkit folder is listed under its data set's name, not its folder name
    names = {
        p.name
        for p in root.iterdir()
        if p.is_dir() and fewshot_layout(p) is not None and p.resolve() not in found.values()
    }
    return sorted(names | set(found))


def _read_labels(
    folder: Path, labelmap: str | None, names_given: Sequence[str] | None, fallback: list[str] | None = None
) -> tuple[list[str], str]:
    """(class names, their source): given (and checked), else the label map, else ``fallback``."""
    from_file = None
    if labelmap and (folder / labelmap).is_file():
        from_file = read_classnames(folder / labelmap)
    if names_given is not None:
        names = list(names_given)
        if from_file is not None and len(from_file) != len(names):
            raise ValueError(
                f"{str(folder / labelmap)!r} names {len(from_file)} classes, but {len(names)} "
                f"class names were given for it"
            )
        if fallback is not None and len(fallback) != len(names):
            raise ValueError(
                f"{str(folder)!r} has {len(fallback)} classes, but {len(names)} class names were given for it"
            )
        return names, "given"
    if from_file is not None:
        if fallback is not None and len(fallback) != len(from_file):
            raise ValueError(
                f"{str(folder / labelmap)!r} names {len(from_file)} classes but the index has {len(fallback)}"
            )
        return from_file, str(folder / labelmap)
    if fallback is not None:
        return fallback, "index"
    raise ValueError(f"no class names for {str(folder)!r}: {labelmap or 'labels.txt'} is missing")


def read_fewshot_dataset(
    root: str | os.PathLike,
    name: str,
    check_files: bool = True,
    toolkit: dict | None = None,
    classnames: Sequence[str] | None = None,
) -> FewShotData:
    """The data set ``name`` under ``root`` (with ``toolkit``, its catalogue entry: the toolkit's download folder),
    every image reference checked; class names: ``classnames``, else ``labels.txt``, else the index's or folders'."""
    folder = None
    if toolkit and toolkit.get("root_folder"):
        folder = find_toolkit_folder(root, toolkit["root_folder"])
    if folder is not None:
        layout = toolkit.get("format", "iris")
        train_index, test_index, labelmap = toolkit["train"], toolkit["test"], toolkit.get("labelmap")
        for idx in (train_index, test_index):
            if not (folder / idx).is_file():
                raise ValueError(
                    f"{name}: the toolkit's folder {str(folder)!r} has no index file {idx!r} "
                    f"(found {describe_folder(folder)})"
                )
    else:
        folder = Path(root) / name
        layout = fewshot_layout(folder)
        if layout is None:
            where = (
                f"neither {str(Path(root) / toolkit['root_folder'])!r} nor "
                if toolkit and toolkit.get("root_folder")
                else "not "
            )
            raise ValueError(
                f"few-shot data set {name!r}: {where}{str(folder)!r} holds a data set. Expected "
                f"{FEWSHOT_LAYOUTS[0]}; or {FEWSHOT_LAYOUTS[1]}. Found in {str(folder)!r}: "
                f"{describe_folder(folder)}; in {str(root)!r}: {describe_folder(root)}"
            )
        train_index, test_index, labelmap = {
            "iris": ("train.txt", "test.txt", "labels.txt"),
            "coco": ("train.json", "test.json", "labels.txt"),
            "imagefolder": ("train", "test", "labels.txt"),
        }[layout]
    templates = None
    for tname in ("templates.txt", "templates.json"):
        if (folder / tname).is_file():
            templates = read_templates(folder / tname)
    source = ImageSource(folder)
    if layout == "iris":
        names, names_source = _read_labels(folder, labelmap, classnames)
        train = read_index_file(folder / train_index, len(names))
        test = read_index_file(folder / test_index, len(names))
    elif layout == "coco":
        cats, train = read_coco_classification(folder / train_index)
        test_cats, test = read_coco_classification(folder / test_index)
        if test_cats != cats:
            raise ValueError(
                f"{str(folder / test_index)!r} and {str(folder / train_index)!r} list different categories"
            )
        names, names_source = _read_labels(folder, labelmap, classnames, fallback=cats)
    elif layout == "imagefolder":
        folders, train_s = scan_image_folder(folder / "train")
        class_to_idx = {c: i for i, c in enumerate(folders)}
        _, test_s = scan_image_folder(folder / "test", class_to_idx, allow_empty=True)
        if not test_s:
            raise ValueError(f"few-shot data set {str(folder / 'test')!r} holds no images")
        train = [(os.path.relpath(p, folder), [y]) for p, y in train_s]
        test = [(os.path.relpath(p, folder), [y]) for p, y in test_s]
        names, names_source = _read_labels(
            folder, labelmap, classnames, fallback=[f.replace("_", " ") for f in folders]
        )
    else:
        raise ValueError(f"{name}: unknown index format {layout!r} (expected 'iris' or 'coco')")
    if check_files:
        source.check([r for r, _ in train], f"{name} train split")
        source.check([r for r, _ in test], f"{name} test split")
    multilabel = any(len(y) > 1 for _, y in train + test)
    return FewShotData(
        name=name,
        classnames=names,
        train=train,
        test=test,
        source=source,
        layout=layout,
        templates=templates,
        multilabel=multilabel,
        folder=str(folder),
        classnames_source=names_source,
    )
