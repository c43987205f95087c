"""The testbed's recipes: the data, model, loader and trainer settings that a testbed run is made of.

A recipe is everything a run shares with every other run of its kind (the batch size, seed and objective
aside): the argv after ``clip-dcl`` that writes its data into ``{DATA}``, and the argv after ``python -m
clip_dcl.train --`` of one run. Runs of two recipes are never paired or pooled. ``micro-bpe`` was the testbed
until 2026-11; the Fashion-MNIST recipes need the IDX files (``apt-get install dataset-fashion-mnist``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Sequence, Tuple

from .runner import Budget, flag_words

#: the synthetic testbed data: 48 shape x colour classes at 32 px, 12,000 training pairs, 1,000 validation
#: and 1,000 test images (5 captions each), 20 zero-shot images per class in each of the two splits
_SYNTH = tuple("data synth {DATA} --image-size 32 --num-classes 48 --train-samples 12000 --test-samples 1000".split())
#: Fashion-MNIST (real images): 20,000 training pairs, 2,000 validation images held out of the official
#: training set, the official 10,000 test images
_FMNIST = tuple("data fashion-mnist {DATA} --train-samples 20000 --val-samples 2000".split())
#: Fashion-MNIST scenes: 20,000 training scenes, 2,000 validation scenes (of 5,000 held-out training images),
#: 2,000 test scenes (of the official test images)
_FSCENES = tuple("data fashion-scenes {DATA} --train-samples 20000 --val-samples 2000 --test-samples 2000".split())
#: trainer settings every recipe shares (OpenCLIP's flags)
_COMMON = {
    "--lr": "1e-3",
    "--wd": "0.1",
    "--warmup": 50,
    "--workers": 1,
    "--log-every-n-steps": 50,
    "--save-frequency": 1,
    "--delete-previous-checkpoint": True,
    "--zeroshot-frequency": 0,
    "--report-to": "",
}


@dataclass(frozen=True)
class Recipe:
    name: str
    summary: str
    model: str
    #: argv after ``clip-dcl`` that writes the recipe's data into ``{DATA}``
    data_argv: Tuple[str, ...]
    #: ``--train-data`` (with ``{DATA}``) and ``--dataset-type``
    train_data: str
    dataset_type: str
    #: validation (retrieval on ``{DATA}/val``) every this many epochs
    val_frequency: int = 1
    #: trainer flags of this recipe beyond :data:`_COMMON`
    extra: Tuple[str, ...] = field(default_factory=tuple)
    #: the training pairs (``--train-num-samples``), the validation shards and their samples
    train_samples: int = 12000
    val_data: str = "{DATA}/val/{00000..00000}.tar"
    val_samples: int = 1000

    def train_argv(
        self,
        *,
        batch_size: int = 32,
        seed: int = 0,
        epochs: int = 20,
        name: str = "run",
        objective: Sequence[str] = ("--loss", "clip"),
        device: str = "cpu",
    ) -> List[str]:
        """The argv after ``python -m clip_dcl.train --`` of one run (``{DATA}``, ``{LOGS}`` left to fill in)."""
        data = {
            "--model": self.model,
            "--train-data": self.train_data,
            "--dataset-type": self.dataset_type,
            "--val-data": self.val_data,
            "--val-num-samples": self.val_samples,
            "--train-num-samples": self.train_samples,
            **_COMMON,
            "--val-frequency": self.val_frequency,
        }
        run = {
            "--batch-size": batch_size,
            "--epochs": epochs,
            "--seed": seed,
            "--device": device,
            "--precision": "fp32" if device == "cpu" else None,
            "--logs": "{LOGS}",
            "--name": name,
        }
        return [*flag_words(data), *self.extra, *flag_words(run), *objective]

    def budget(self, **fields) -> Budget:
        """The recipe as a :class:`Budget` (its model, trainer settings and extra flags; ``fields``: the rest, such
        as the epochs), for a report that states what its runs trained with."""
        return Budget(
            lr=float(_COMMON["--lr"]),
            wd=float(_COMMON["--wd"]),
            warmup=_COMMON["--warmup"],
            workers=_COMMON["--workers"],
            model=self.model,
            log_every_n_steps=_COMMON["--log-every-n-steps"],
            extra=self.extra,
            **fields,
        )


def _packed(name: str, summary: str, model: str, data_argv: Tuple[str, ...], **more) -> Recipe:
    return Recipe(
        name,
        summary,
        model,
        data_argv + ("--pack",),
        "{DATA}/train.npz",
        "auto",
        val_frequency=4,
        extra=("--adamw-impl", "fused"),
        **more,
    )


_FASHION = {"train_samples": 20000, "val_samples": 2000}

RECIPES: Dict[str, Recipe] = {
    "micro-bpe": Recipe(
        "micro-bpe",
        "clip-dcl-micro (OpenCLIP's BPE) on webdataset shards, validation every epoch",
        "clip-dcl-micro",
        _SYNTH,
        "{DATA}/train/{00000..00007}.tar",
        "webdataset",
    ),
    "micro-words": _packed(
        "micro-words",
        "clip-dcl-micro-words (word vocabulary, 1-layer text tower) on the shards packed in "
        "memory, fused AdamW, validation every 4th epoch",
        "clip-dcl-micro-words",
        _SYNTH,
    ),
    "fmnist-words": _packed(
        "fmnist-words",
        "clip-dcl-micro-fmnist on Fashion-MNIST's real images (captions from their pixels), packed "
        "in memory, fused AdamW, validation every 4th epoch",
        "clip-dcl-micro-fmnist",
        _FMNIST,
        **_FASHION,
    ),
    "fscenes-words": _packed(
        "fscenes-words",
        "clip-dcl-micro-fscenes on scenes of 2-4 Fashion-MNIST photographs in a 2 x 2 grid (captions "
        "naming each item, its cell and measured attributes), packed in memory, fused AdamW, "
        "validation every 4th epoch",
        "clip-dcl-micro-fscenes",
        _FSCENES,
        **_FASHION,
    ),
    "fscenes4-words": _packed(
        "fscenes4-words",
        "fscenes-words with four items a scene, each named with two attributes",
        "clip-dcl-micro-fscenes",
        _FSCENES + ("--min-items", "4", "--min-attributes", "2"),
        **_FASHION,
    ),
}
#: the recipe the testbed uses unless told otherwise
DEFAULT_RECIPE = "micro-words"


def get_recipe(name: str) -> Recipe:
    """The recipe called ``name``; ``ValueError`` naming the known ones otherwise."""
    try:
        return RECIPES[name]
    except KeyError:
        raise ValueError(f"unknown testbed recipe {name!r}; choose from {sorted(RECIPES)}") from None


def fill(argv: Sequence[str], data: str, logs: str = "") -> List[str]:
    """``argv`` with ``{DATA}`` and ``{LOGS}`` replaced (shard patterns' own braces are left alone)."""
    return [a.replace("{DATA}", str(data)).replace("{LOGS}", str(logs)) for a in argv]
