"""The checks of a training command line that run before any work (called by :mod:`clip_dcl.train.flags`): its
words, values, the global batch, the output folders, the data's paths, what a packed training set cannot honour.
"""

from __future__ import annotations

import argparse
import glob
import math
import os
from typing import List, Optional

from ..errors import FlagError


def first_bad_value(*checks):
    """``(flag, value, want)`` of the first ``(flag, value, ok, want)`` whose value is given but not a finite
    number that passes ``ok``, or None."""
    for flag, value, ok, want in checks:
        if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value) and ok(value)):
            return flag, value, want
    return None


def check_optimizer_values(oc_args) -> None:
    """OpenCLIP's optimizer and schedule values that cannot train, refused before the model is built
    (torch's optimizer would raise its own traceback after it): the first bad one is named."""
    training = bool(oc_args.train_data) or oc_args.dataset_type == "synthetic"
    if training and oc_args.epochs == 0:
        raise FlagError("--epochs 0: the run would train nothing; give --epochs 1 or more")
    bad = first_bad_value(
        ("--lr", oc_args.lr, lambda v: v > 0, "a finite number > 0"),
        ("--wd", oc_args.wd, lambda v: v >= 0, "a finite number >= 0"),
        ("--beta1", oc_args.beta1, lambda v: 0 <= v < 1, "in [0, 1)"),
        ("--beta2", oc_args.beta2, lambda v: 0 <= v < 1, "in [0, 1)"),
        ("--eps", oc_args.eps, lambda v: v > 0, "a finite number > 0"),
        ("--momentum", getattr(oc_args, "momentum", None), lambda v: v >= 0, "a finite number >= 0"),
        ("--grad-clip-norm", oc_args.grad_clip_norm, lambda v: v > 0, "a finite number > 0"),
        ("--warmup", oc_args.warmup, lambda v: v >= 0, "an integer >= 0"),
        ("--batch-size", oc_args.batch_size, lambda v: v >= 1, "an integer >= 1"),
        ("--accum-freq", oc_args.accum_freq, lambda v: v >= 1, "an integer >= 1"),
        ("--epochs", oc_args.epochs, lambda v: v >= 0, "an integer >= 0"),
        ("--train-num-samples", oc_args.train_num_samples, lambda v: v >= 1, "an integer >= 1"),
    )
    if bad:
        flag, value, want = bad
        shown = f"{value:g}" if isinstance(value, (int, float)) else repr(value)
        raise FlagError(f"{flag} {shown}: must be {want}")


def check_global_batch(oc_args) -> None:
    """Refuse a training step (``--accum-freq`` micro-batches over every rank) of fewer than 2 pairs: with no
    negative, every objective's loss is 0 (clip) or undefined."""
    from open_clip_train.distributed import world_info_from_env

    world = world_info_from_env()[2]
    pairs = oc_args.batch_size * oc_args.accum_freq * world
    if pairs < 2:
        raise FlagError(
            f"--batch-size {oc_args.batch_size}: a contrastive loss needs at least 2 pairs a step, and "
            f"--batch-size {oc_args.batch_size} x --accum-freq {oc_args.accum_freq} x {world} rank(s) "
            f"gives {pairs}: give --batch-size 2 or more"
        )


def shard_folders_as_patterns(words: list) -> tuple:
    """``words`` with each ``--train-data`` / ``--val-data`` value (or ``::``-joined part) that names a folder
    replaced by the pattern of its ``.tar`` shards, as ``clip-dcl eval retrieval --data`` reads a folder; and
    ``(flag, folder, pattern)`` for each replaced. `FlagError` for a folder no pattern lists."""
    from clip_dcl.data.pairs import caption_folder_hint, is_caption_folder
    from clip_dcl.data.shards import folder_pattern

    out, replaced = list(words), []
    for flag in ("--train-data", "--val-data"):
        for at, value, prefix in _flag_values(out, flag):
            parts = value.split("::")
            for j, part in enumerate(parts):
                if part and os.path.isdir(part):
                    if is_caption_folder(part):
                        raise FlagError(f"{flag} {caption_folder_hint(part)}")
                    split = os.path.join(part, "train" if flag == "--train-data" else "val")
                    if not glob.glob(os.path.join(glob.escape(part), "*.tar")) and os.path.isdir(split):
                        part = split  # the folder `clip-dcl data shards` or `data synth` wrote: its split
                    try:
                        parts[j] = folder_pattern(part)
                    except (ValueError, OSError) as e:
                        raise FlagError(f"{flag}: {e}") from None
                    replaced.append((flag, part, parts[j]))
            out[at] = prefix + "::".join(parts)
    return out, replaced


def _shard_sizes(urls: list):
    """Each shard's sample count from the ``sizes.json`` beside it (as OpenCLIP's ``get_dataset_size``
    reads it), or None when one is not known."""
    import json

    tables, sizes = {}, []
    for url in urls:
        folder = os.path.dirname(url)
        if folder not in tables:
            try:
                with open(os.path.join(folder, "sizes.json")) as f:
                    tables[folder] = json.load(f)
            except (OSError, ValueError):
                return None
        try:
            sizes.append(int(tables[folder][os.path.basename(url)]))
        except (KeyError, TypeError, ValueError):
            return None
    return sizes


def check_worker_batches(oc_args) -> None:
    """Every data-loader worker of every rank can fill a batch from its own shards; with ``sizes.json`` known, a
    worker's fewest samples are those of the ``shards // workers`` smallest shards. Checked before the model is
    built; the pipeline would find out only after it."""
    from open_clip_train.distributed import world_info_from_env

    from ..paths import expand_pattern
    from .facts import train_data_kind

    if (
        not oc_args.train_data
        or oc_args.dataset_type == "synthetic"
        or oc_args.dataset_resampled
        or train_data_kind(oc_args) != "webdataset"
    ):
        return
    try:
        urls = expand_pattern(oc_args.train_data)
    except (ValueError, TypeError):
        return  # check_data_paths names a pattern that does not expand
    world = world_info_from_env()[2]
    per_rank = max(1, oc_args.workers)
    readers = per_rank * world
    ranks = f" x {world} ranks" if world > 1 else ""
    if len(urls) < readers:
        fewer = max(1, len(urls) // world)
        raise FlagError(
            f"--train-data has {len(urls)} shard(s) for --workers {oc_args.workers}{ranks}: each worker "
            f"reads shards of its own, so {readers} are needed; give --workers {fewer} or fewer, more "
            "shards, or --dataset-resampled"
        )
    sizes = _shard_sizes(urls)
    if sizes is None:
        return

    def fewest(n_readers: int) -> int:
        return sum(sorted(sizes)[: len(sizes) // n_readers])

    least = fewest(readers)
    if oc_args.batch_size > least:
        fix = f"give --batch-size {least} or less"
        if per_rank > 1 and fewest(world) >= oc_args.batch_size:
            fix += ", or fewer --workers"
        raise FlagError(
            f"--batch-size {oc_args.batch_size} is more than the {least} samples a data-loader worker may "
            f"be given: the {len(sizes)} training shard(s) ({sum(sizes)} samples) are split over {readers} "
            f"worker(s) (--workers {oc_args.workers}{ranks}), and each fills whole batches from its own "
            f"shards; {fix}"
        )


def check_output_paths(oc_args) -> None:
    """``--logs`` can be written (OpenCLIP creates ``--logs/--name`` there at the start, and every
    checkpoint after that), and ``--resume PATH`` is a checkpoint file, not a folder."""
    from clip_dcl.paths import folder_problem

    logs = oc_args.logs
    if logs and str(logs).lower() != "none":
        problem = folder_problem(logs)
        if problem:
            raise FlagError(f"--logs {logs}: {problem}")
    resume = oc_args.resume
    if resume and resume != "latest" and "://" not in str(resume):
        if os.path.isdir(resume):
            raise FlagError(
                f"--resume {resume} is a folder, not a checkpoint file: give a file in it "
                "(e.g. checkpoints/epoch_N.pt), or --resume latest with the run's --logs and --name"
            )
        if not os.path.exists(resume):
            raise FlagError(f"--resume {resume} does not exist")


def check_data_paths(oc_args) -> None:
    """Every local file of ``--train-data`` / ``--val-data`` exists and is readable, so that a wrong path fails
    here, naming the first missing file, not in the data workers (``pipe:`` and ``scheme://`` urls are left
    to the pipeline)."""
    from ..paths import expand_pattern

    for flag, value in (("--train-data", oc_args.train_data), ("--val-data", oc_args.val_data)):
        if not value or oc_args.dataset_type == "synthetic":
            continue
        try:
            urls = expand_pattern(value)
        except (ValueError, TypeError) as e:
            raise FlagError(f"{flag} {value!r}: cannot expand the shard pattern ({e})") from None
        local = [u for u in urls if "://" not in u and not u.startswith("pipe:")]
        missing = [u for u in local if not os.path.isfile(u)]
        if missing:
            more = f" (and {len(missing) - 1} more of {len(urls)})" if len(missing) > 1 else ""
            raise FlagError(f"{flag}: {missing[0]!r} does not exist{more}")
        unreadable = [u for u in local if not os.access(u, os.R_OK)]
        if unreadable:
            raise FlagError(f"{flag}: {unreadable[0]!r} is not readable")


def check_packed_flags(oc_args) -> None:
    """A packed training set (``--train-data PATH.npz``) refuses the flags it cannot honour, here, before any work."""
    from .packed import PackedDataError, check_flags, is_packed

    if oc_args.dataset_type == "auto" and is_packed(oc_args.train_data):
        try:
            check_flags(oc_args)
        except PackedDataError as e:
            raise FlagError(str(e)) from None


def check_ranks_against_devices(local_ranks: int, device: str) -> None:
    """On CUDA, ``local_ranks`` processes on this node need as many visible GPUs (each rank takes
    ``cuda:LOCAL_RANK``); nothing to check on a CPU, nor where no GPU is visible (OpenCLIP falls back to it)."""
    import torch

    if local_ranks <= 1 or str(device).split(":")[0] != "cuda" or not torch.cuda.is_available():
        return
    gpus = torch.cuda.device_count()
    if local_ranks > gpus:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        where = f" (CUDA_VISIBLE_DEVICES={visible})" if visible else ""
        raise FlagError(
            f"{local_ranks} ranks on this node but {gpus} GPU{'s' if gpus != 1 else ''} visible{where}: "
            f"one rank per GPU; start {gpus} (NPROC={gpus}, --nproc_per_node {gpus}), or train on the "
            "CPU with --device cpu"
        )


def _flag_values(words: list, flag: str):
    """``(index, value, prefix)`` of each value ``words`` give ``flag``: ``--flag V`` or ``--flag=V``."""
    for i, word in enumerate(words):
        if word == flag and i + 1 < len(words):
            yield i + 1, words[i + 1], ""
        elif word.startswith(flag + "="):
            yield i, word[len(flag) + 1 :], flag + "="


def _word_value(words: list, flag: str):
    """The value ``words`` give ``flag`` (the last one counts), or None."""
    values = [value for _, value, _ in _flag_values(words, flag)]
    return values[-1] if values else None


#: How many rows of a training CSV have their image looked for before training (the rest fail in the loader).
CSV_ROWS_CHECKED = 1000


def csv_data_flags(words: list) -> list:
    """``words`` with OpenCLIP's ``--csv-*`` flags added for a CSV/TSV ``--train-data`` / ``--val-data`` where not
    given, as ``clip-dcl eval retrieval`` reads the file; `FlagError` for a missing column or for an image of the
    first :data:`CSV_ROWS_CHECKED` rows found neither beside the CSV nor from the working folder."""
    import pandas as pd

    from clip_dcl.data.pairs import CsvColumnsError, csv_columns

    dataset_type = _word_value(words, "--dataset-type") or "auto"
    given = {flag: _word_value(words, flag) for flag in ("--csv-separator", "--csv-img-key", "--csv-caption-key")}
    seen = {}
    for flag in ("--train-data", "--val-data"):
        path = _word_value(words, flag)
        if not path or not os.path.isfile(path):
            continue
        if not (dataset_type == "csv" or (dataset_type == "auto" and path.lower().endswith((".csv", ".tsv")))):
            continue
        sep = given["--csv-separator"]
        try:
            cols = csv_columns(path, given["--csv-img-key"], given["--csv-caption-key"], sep)
        except CsvColumnsError as e:
            raise FlagError(f"{flag} {e}") from None
        wanted = {"--csv-separator": cols.sep, "--csv-img-key": cols.img_key, "--csv-caption-key": cols.caption_key}
        for name, value in wanted.items():
            if given[name] is None and seen.setdefault(name, value) != value:
                raise FlagError(
                    f"--train-data and --val-data are CSVs of different {name[6:]}s ({seen[name]!r}, "
                    f"{value!r}): give {name}"
                )
        try:
            images = pd.read_csv(
                path, sep=cols.sep, usecols=[cols.img_key], dtype=str, nrows=CSV_ROWS_CHECKED, keep_default_na=False
            )[cols.img_key]
        except (ValueError, OSError) as e:  # pandas' ParserError is a ValueError
            raise FlagError(f"{flag} {path} cannot be read as a CSV: {' '.join(str(e).split())}") from None
        for line, image in enumerate(images, 2):
            if not (os.path.isfile(os.path.join(os.path.dirname(path), image)) or os.path.isfile(image)):
                raise FlagError(
                    f"{flag} {path} line {line}: image {image!r} is neither beside the CSV nor in the working folder"
                )
    return list(words) + [word for pair in seen.items() for word in pair]


def check_words(argv: List[str], parsers: List[argparse.ArgumentParser]) -> None:
    """Refuse (`FlagError`, one line) a word that ``parsers`` would misread or answer with a usage block: a
    ``--flag`` not spelled out in full (OpenCLIP's parser takes abbreviations, so a mistyped ``--los decl`` would
    set ``--loss-dist-impl``), one no parser knows (naming the closest; argparse says "unrecognized arguments"),
    and a value that is not one of its flag's choices (naming the closest). A word is read as argparse reads it:
    an option up to its ``=``; a word with a space is a value; what follows ``--`` is positional."""
    from ..arguments import misspelt_flag, not_one_of

    actions = {s: a for parser in parsers for s, a in parser._option_string_actions.items()}  # no public list
    words = argv[: argv.index("--")] if "--" in argv else list(argv)
    for word in words:
        name = word.split("=", 1)[0]
        if name.startswith("--") and name != "--" and " " not in name and name not in actions:
            candidates = sorted(flag for flag in actions if flag.startswith(name))
            if candidates:
                raise FlagError(
                    f"{name} is not a flag (flags are spelled out in full); it could mean {', '.join(candidates)}"
                )
    found = misspelt_flag(words, actions)
    if found:
        raise FlagError(f"{found[0]} is not a flag of clip-dcl or OpenCLIP; the closest: {', '.join(found[1])}")
    for i, word in enumerate(words):
        name, eq, value = word.partition("=")
        action = actions.get(name)
        if action is None or not action.choices or (not eq and i + 1 >= len(argv)):
            continue
        value = value if eq else argv[i + 1]
        if callable(action.type):  # choices of another type than str are compared as argparse would
            try:
                value = action.type(value)
            except (TypeError, ValueError):
                continue  # argparse's own message names the bad value
        if value not in action.choices:
            raise FlagError(not_one_of(value, list(action.choices), f"a choice of {name}"))


def _openclip_objective(oc_args, coca: bool = True, horovod: bool = True) -> Optional[str]:
    """The first flag given that selects an objective only OpenCLIP's own loss trains, or None."""
    for bad, why in (
        (oc_args.siglip, "--siglip"),
        (oc_args.distill_model, "--distill-model"),
        (coca and "coca" in oc_args.model.lower(), f"--model {oc_args.model} (CoCa)"),
        (horovod and oc_args.horovod, "--horovod"),
    ):
        if bad:
            return why
    return None
