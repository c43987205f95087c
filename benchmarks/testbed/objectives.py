"""The batch-size testbed's objectives and settings: every flag written out from the loss registry.

Each objective is a name and the full ``--loss ...`` flags of :func:`clip_dcl.experiment.commands.loss_flags`,
so that a run recorded under a name keeps its meaning whatever the package defaults become. The variants of
the screens each change one setting of the package default the screen ran against; the temperature controls
fix one arm's logit scale at the other's final one, read from the validation sweep's archived runs.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Dict, List, Optional

from clip_dcl.experiment.commands import loss_flags
from clip_dcl.experiment.scoring import MEAN_R1

#: the repository root (this file is benchmarks/testbed/objectives.py)
ROOT = Path(__file__).resolve().parents[2]
#: the committed reports of the testbed (read for the archived sweep, the code checks, the sibling reports)
RESULTS = ROOT / "benchmarks" / "results"

MODEL = "clip-dcl-micro"
DATA = dict(image_size=32, num_classes=48, train_samples=12000, test_samples=1000)
HEADLINE = ((MEAN_R1, "retrieval mean R@1"), ("zeroshot/top1", "zero-shot top-1"))
BATCH_SIZES = (16, 32, 64, 128, 256, 512)
SCREEN_BATCH_SIZES = (16, 64)
#: the sweep's DeCL variants, picked by the 20-epoch screen (seed 0, report ``batch_size.md``): the
#: package default (the relative estimate, best at B = 16 with 19.0 R@1), the absolute estimate (the
#: default when the screen ran) and the batch rate (best at B = 64, 41.7); the queue and
#: read-then-update collapsed there
SWEEP_VARIANTS = ("decl default", "decl absolute", "decl batch")
GATE_POINTS = 0.03
#: the validation-split sweep of the gate, screen and sweep stages (scored before the test split existed)
ARCHIVE = RESULTS / "batch_size_validation_sweep.json"
#: the data's seed (``clip-dcl data synth --seed``): draw 0 holds every split the verdicts read; another draw,
#: same recipe, repeats the decisive comparison (``--data-seed``) in a data folder of its own
DATA_SEED = 0
DECISIVE_SIZES = (32, 64)
#: the batch sizes the verdict table covers (16 from the validation sweep: no test-split runs there)
VERDICT_SIZES = (16, 32, 64)
#: the package default when the screen ran: the screen's variants change one setting of it, and
#: keep their flags (so their cached runs) whatever the package default is now
SCREEN_BASE = {"estimate": "absolute"}
#: DeCL variants: the package default, then the screen's, each one setting away from SCREEN_BASE.
DECL_VARIANTS = {
    "decl default": {},
    "decl absolute": dict(SCREEN_BASE),
    "decl FastCLIP gamma (cosine to 0.2)": {**SCREEN_BASE, "gamma": 0.2, "gamma_schedule": "cosine"},
    "decl queue": {**SCREEN_BASE, "rate": "queue"},
    "decl read-then-update": {**SCREEN_BASE, "include_current": False},
    "decl batch": {**SCREEN_BASE, "rate": "batch"},
    "decl scale learned by both terms": {**SCREEN_BASE, "temperature_mode": "learned"},
    "decl RGCL-g temperature": {**SCREEN_BASE, "temperature_mode": "rgclg"},
}
#: B = 16, where no variant reached ``clip`` on the validation split: settings of the package default's
#: relative estimate screened there (``--stage screen16``, validation split, one seed), each one setting away
#: from the package default; the best goes on to the test split with the seeds the rule needs
SCREEN16_VARIANTS = {
    "decl gamma 0.5": {"gamma": 0.5},
    "decl gamma 0.2": {"gamma": 0.2},
    "decl schedule decl": {"schedule": "decl"},
    "decl schedule harmonic": {"schedule": "harmonic"},
    "decl schedule constant": {"schedule": "constant"},  # at lambda 1 (the default): the decl schedule exactly
    "decl schedule constant 0.5": {"schedule": "constant", "lam": 0.5},
}
SCREEN16_SIZE = 16
BASELINES = {"clip": ("--loss", "clip")}
#: ``--loss dcl`` with no other loss flag, whatever the package defaults are when it runs (its
#: record's commit says which): checked against ``clip`` at :data:`DCL_DEFAULT_SIZE` on the test split
DCL_DEFAULT = "dcl package default"
DCL_DEFAULT_SIZE = 64
#: ``dcl``'s package defaults when its screen ran: every ``dcl`` objective here spells them out, so that
#: a cached run keeps its meaning whatever the package default becomes
DCL_SCREEN_BASE = {"tau_plus": 0.1, "clamp": "clamp", "same_class": "positive"}
#: ``dcl`` settings screened on the validation split (``--stage dcl-screen``): each one setting away from
#: :data:`DCL_SCREEN_BASE`, in the order they run; ``dcl top tau+ 0.021`` is one setting from ``dcl tau+ 0.021``
DCL_VARIANTS = {
    "dcl top": {"same_class": "top"},
    "dcl top tau+ 0.021": {"same_class": "top", "tau_plus": 0.021},
    "dcl biased clamp": {"clamp": "biased"},
    "dcl tau+ 0.021": {"tau_plus": 0.021},
    "dcl tau+ 0.01": {"tau_plus": 0.01},
    "dcl temperature 0.1": {"temperature": 0.1},
    "dcl temperature 0.5": {"temperature": 0.5},
    "dcl tau+ auto": {"tau_plus": "auto"},
    "dcl default": {},
}
#: the ``dcl`` settings through the screen's bar, swept at every batch size and seed against ``clip`` on the
#: test split (``--stage dcl-sweep``): one passed (``dcl tau+ 0.01``); the next best trailed ``clip`` by 11 points
DCL_SWEEP_VARIANTS = ("dcl tau+ 0.01",)
DCL_SWEEP_SIZES = (16, 32, 64, 128, 256)


@functools.lru_cache(maxsize=1)
def _archive() -> Optional[dict]:
    """:data:`ARCHIVE`'s document, read once (the reports read it for every objective and table)."""
    return json.loads(ARCHIVE.read_text()) if ARCHIVE.is_file() else None


def archived_runs(data_config: Optional[dict] = None) -> List[dict]:
    """The validation-split runs of the gate, screen and sweep (:data:`ARCHIVE`), each marked with its split;
    none when ``data_config`` (the testbed's, test split aside) is not the data they trained on."""
    doc = _archive()
    if doc is None:
        return []
    if data_config is not None and {k: v for k, v in data_config.items() if k != "test_samples"} != doc["data"]:
        return []
    return [{**r, "split": "validation", "source": "archived"} for r in doc["runs"]]


def final_scale(label: str, b: int) -> Optional[float]:
    """The mean final logit scale of ``label`` at batch ``b`` over the validation sweep's seeds."""
    ends = [
        r["logit_scale"][-1]
        for r in archived_runs()
        if r["label"] == label and r["batch_size"] == b and r["logit_scale"]
    ]
    return round(sum(ends) / len(ends), 1) if ends else None


def control_objectives() -> Dict[str, tuple]:
    """The temperature controls at each decisive batch size: InfoNCE (``dcl`` at ``tau_plus`` 0, which is
    InfoNCE exactly) at ``decl default``'s final scale, and ``decl default`` at ``clip``'s, both fixed."""
    out = {}
    for b in DECISIVE_SIZES:
        decl_s, clip_s = final_scale("decl default", b), final_scale("clip", b)
        if decl_s:  # without --dcl-same-class, which a prior of 0 leaves unused: the flags the arm first ran with
            flags = loss_flags("dcl", tau_plus=0.0, temperature=round(1 / decl_s, 5))
            at = flags.index("--dcl-same-class") if "--dcl-same-class" in flags else None
            out[f"clip at decl's scale (B={b})"] = flags if at is None else flags[:at] + flags[at + 2 :]
        if clip_s:
            out[f"decl at clip's scale (B={b})"] = loss_flags(
                "decl", temperature_mode="fixed", temperature=round(1 / clip_s, 5)
            )
    return out


def screen_objectives() -> List[str]:
    """The objectives of the gate, screen and sweep (every one but the temperature controls and the ``dcl``
    screen, which came later)."""
    later = {**control_objectives(), **DCL_VARIANTS, DCL_DEFAULT: (), **SCREEN16_VARIANTS}
    return [name for name in objectives() if name not in later]


def objectives() -> Dict[str, tuple]:
    """Every objective of the testbed, by name: its full loss flags (a new dict each call)."""
    return dict(_objectives())


@functools.lru_cache(maxsize=1)
def _objectives() -> Dict[str, tuple]:
    out = dict(BASELINES)
    out["dcl tau+ 0.05"] = loss_flags("dcl", **{**DCL_SCREEN_BASE, "tau_plus": 0.05})
    out.update({name: loss_flags("decl", **settings) for name, settings in DECL_VARIANTS.items()})
    out.update(control_objectives())
    out.update({name: loss_flags("dcl", **{**DCL_SCREEN_BASE, **settings}) for name, settings in DCL_VARIANTS.items()})
    out[DCL_DEFAULT] = ("--loss", "dcl")
    out.update({name: loss_flags("decl", **settings) for name, settings in SCREEN16_VARIANTS.items()})
    return out
