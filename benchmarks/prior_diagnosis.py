"""What ``--tau-plus auto`` estimates in a trained model: the negatives' scores split by latent relation.

``dcl``'s ``tau_plus = "auto"`` (:mod:`clip_dcl.losses.prior`) fits two Gaussians to the batch's
negative logits and takes the upper one's weight as the class prior. In the sampling-bias
benchmark (``sampling_bias.py --extra``) its estimate ended far above the synthetic data's true
prior. This script says why, from the checkpoints that benchmark left in its ``--work`` folder:
for each run and training seed it encodes ``--samples`` training pairs (images and their first
caption) of the synthetic shards, and splits the image-to-caption logits of the negatives by how
the two samples' latent attributes (shape x colour = the class) relate:

- ``same class`` (the true false negatives, share = tau_plus),
- ``same colour only`` and ``same shape only`` (one of the class's two attributes),
- ``neither``;

then reports, per relation, the share of negatives and the mean and standard deviation of their
logits, and the estimator's value on all negatives and on the ``same class`` + ``neither``
negatives alone (a clean two-class mixture, whose true weight is printed beside it).

Run ``.venv/bin/python benchmarks/prior_diagnosis.py --work DIR`` after ``sampling_bias.py --extra
--work DIR``; writes ``prior_diagnosis.md`` / ``.json`` into ``benchmarks/results`` (``--results``).
A minute or two on 2 CPU cores. ``--quick`` reads the runs of ``sampling_bias.py --quick --work DIR``
(``clip`` and ``dcl tau+=0.25``) and writes its report under ``DIR``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import torch

from clip_dcl import experiment as ex
from clip_dcl.experiment import arguments
from clip_dcl.experiment.reporting import Report, markdown_table, utc_date

HERE = Path(__file__).resolve().parent
STEM = "prior_diagnosis"
RUNS = ("clip", "dcl tau+=0.25", "dcl tau+=0.05", "dcl tau+=auto")
RELATIONS = ("same class", "same colour only", "same shape only", "neither")


def relation_masks(shapes: Sequence[str], colours: Sequence[str]) -> Dict[str, torch.Tensor]:
    """``(n, n)`` boolean masks over ordered pairs ``i != j``, one per relation of :data:`RELATIONS`."""
    shape = [[a == b for b in shapes] for a in shapes]
    colour = [[a == b for b in colours] for a in colours]
    s, c = torch.tensor(shape), torch.tensor(colour)
    off = ~torch.eye(len(shapes), dtype=torch.bool)
    return {
        "same class": s & c & off,
        "same colour only": c & ~s & off,
        "same shape only": s & ~c & off,
        "neither": ~s & ~c & off,
    }


def read_pairs(shard: Path, samples: int):
    """The first ``samples`` (image, first caption, shape, colour) of a synthetic shard, in key order."""
    import webdataset as wds

    out = []
    for sample in wds.WebDataset(str(shard), shardshuffle=False).decode("pil"):
        meta = sample["json"]
        out.append((sample["jpg"].convert("RGB"), meta["captions"][0], meta["shape"], meta["colour"]))
        if len(out) == samples:
            break
    if len(out) < samples:
        raise SystemExit(f"{shard} holds {len(out)} samples, fewer than --samples {samples}")
    return out


def diagnose(checkpoint: Path, pairs) -> dict:
    """Per relation: share of negatives, mean and sd of their logits; the estimate on all and on a clean mixture."""
    from clip_dcl.checkpoint import load_checkpoint
    from clip_dcl.losses.prior import estimate_tau_plus

    model, preprocess, tokenizer = load_checkpoint(checkpoint)
    with torch.no_grad():
        f = torch.nn.functional.normalize(model.encode_image(torch.stack([preprocess(p[0]) for p in pairs])), dim=-1)
        g = torch.nn.functional.normalize(model.encode_text(tokenizer([p[1] for p in pairs])), dim=-1)
        scale = model.logit_scale.exp()
        logits = scale * f @ g.T
    masks = relation_masks([p[2] for p in pairs], [p[3] for p in pairs])
    off = ~torch.eye(len(pairs), dtype=torch.bool)
    out = {
        "logit_scale": float(scale),
        "positive": {"mean": float(logits.diagonal().mean()), "sd": float(logits.diagonal().std())},
    }
    for name, mask in masks.items():
        x = logits[mask]
        out[name] = {"share": float(mask.sum() / off.sum()), "mean": float(x.mean()), "sd": float(x.std())}
    out["estimate"] = estimate_tau_plus(logits[off], logits.diagonal())
    out["sklearn_estimate"] = sklearn_upper_weight(logits[off])
    clean = masks["same class"] | masks["neither"]
    out["clean_estimate"] = estimate_tau_plus(logits[clean], logits.diagonal())
    out["clean_truth"] = float(masks["same class"].sum() / clean.sum())
    return out


def sklearn_upper_weight(scores: torch.Tensor) -> float:
    """The upper component's weight of scikit-learn's ``GaussianMixture`` (k-means start, 3 restarts) on ``scores``:
    the same model as the estimator's, fitted from another start."""
    from sklearn.mixture import GaussianMixture

    x = scores.detach().double().reshape(-1, 1).cpu().numpy()
    gm = GaussianMixture(2, n_init=3, random_state=0).fit(x)
    return float(gm.weights_[gm.means_[:, 0].argmax()])


def checkpoints(work: Path, runs: Sequence[str]) -> Dict[str, List[tuple]]:
    """``{run: [(seed, checkpoint), ...]}`` from the sampling-bias benchmark's score caches under ``work``."""
    found: Dict[str, List[tuple]] = {r: [] for r in runs}
    for cache in sorted((work / "scores").glob("*.json")):
        doc = json.loads(cache.read_text())
        flags = doc.get("settings", {}).get("flags", [])
        seed = doc.get("settings", {}).get("budget", {}).get("seed")
        for run in runs:
            if run == name_of(flags) and Path(doc.get("checkpoint", "")).is_file():
                found[run].append((seed, Path(doc["checkpoint"])))
    return {r: sorted(v) for r, v in found.items()}


def name_of(flags: Sequence[str]) -> str:
    """The sampling-bias run name of plain ``clip`` / ``dcl --tau-plus T`` flags ("" for any other variant)."""
    flags = list(flags)
    if flags == ["--loss", "clip"]:
        return "clip"
    if len(flags) == 4 and flags[:3] == ["--loss", "dcl", "--tau-plus"]:
        return f"dcl tau+={flags[3]}"
    return ""


def table(results: Dict[str, List[dict]], truth: float) -> str:
    """Markdown: per run, means over seeds of the estimate and of each relation's logits."""

    def avg(rows, *path):
        vals = []
        for r in rows:
            v = r
            for p in path:
                v = v[p]
            vals.append(v)
        return sum(vals) / len(vals)

    head = [
        "run",
        "seeds",
        f"estimate (all negatives; truth {truth:.3f})",
        "scikit-learn fit, k-means start",
        "positive logit",
    ]
    head += [f"{r} logit (share)" for r in RELATIONS] + ["estimate (same class + neither only)", "its truth"]
    rows = []
    for run, per_seed in results.items():
        if not per_seed:
            continue
        cells = [
            run,
            str(len(per_seed)),
            f"{avg(per_seed, 'estimate'):.3f}",
            f"{avg(per_seed, 'sklearn_estimate'):.3f}",
            f"{avg(per_seed, 'positive', 'mean'):.2f}",
        ]
        for rel in RELATIONS:
            cells.append(
                f"{avg(per_seed, rel, 'mean'):.2f} ± {avg(per_seed, rel, 'sd'):.2f} ({avg(per_seed, rel, 'share'):.2f})"
            )
        rows.append(cells + [f"{avg(per_seed, 'clean_estimate'):.3f}", f"{avg(per_seed, 'clean_truth'):.3f}"])
    return markdown_table(head, rows)


def main(argv: Optional[List[str]] = None) -> int:
    p = arguments.benchmark_parser("prior_diagnosis.py", __doc__)
    p.add_argument(
        "--work",
        default="/tmp/clip_dcl_sampling_bias",
        help="the --work folder of a finished sampling_bias.py --extra run",
    )
    p.add_argument("--runs", nargs="+", default=list(RUNS), help="run names to diagnose")
    p.add_argument(
        "--samples", type=int, default=None, help="training pairs encoded per checkpoint (default 512; quick 64)"
    )
    p.add_argument(
        "--results",
        default=None,
        help=f"folder of the report (default {HERE / 'results'}; with --quick WORK/quick/report)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="smoke run on the checkpoints of sampling_bias.py --quick --work WORK; report under --work",
    )
    args, argv = arguments.parse(p, argv)
    args.samples = args.samples or (64 if args.quick else 512)
    if args.samples < 8:
        raise SystemExit(f"--samples must be >= 8, got {args.samples}")
    work, results_dir = arguments.work_and_results(args, HERE / "results")
    summary = work / "data" / "summary.json"
    if not summary.is_file():
        raise SystemExit(
            f"no synthetic data under {work / 'data'}: run benchmarks/sampling_bias.py "
            f"{'--quick' if args.quick else '--extra'} --work {args.work} first"
        )
    truth = float(json.loads(summary.read_text())["tau_plus"])
    found = checkpoints(work, args.runs)
    if not any(found.values()):
        raise SystemExit(f"no finished run of {args.runs} under {work / 'scores'}")
    started, t0 = utc_date(), time.perf_counter()
    pairs = read_pairs(sorted((work / "data" / "train").glob("*.tar"))[0], args.samples)
    results: Dict[str, List[dict]] = {}
    for run, items in found.items():
        results[run] = []
        for seed, ckpt in items:
            print(f"[prior_diagnosis] {run}, seed {seed}: {ckpt}", flush=True)
            results[run].append({"seed": seed, **diagnose(ckpt, pairs)})
            print(f"[prior_diagnosis]     estimate {results[run][-1]['estimate']:.3f} (truth {truth:.3f})", flush=True)
    report = Report(results_dir, STEM, ex.command_line("prior_diagnosis.py", argv), date=started)
    md = "\n".join(
        [
            "# What `--tau-plus auto` estimates: the negatives' logits by latent relation",
            "",
            *report.about(date=f"{started}; {time.perf_counter() - t0:.0f} s"),
            f"- Data: the first {args.samples} training pairs of the sampling-bias benchmark's synthetic shards "
            f"(image and its first caption); classes are shape x colour, true tau_plus {truth:.3f}. "
            "Checkpoints: the final ones of `sampling_bias.py --extra` (one per training seed).",
            "- Columns: the estimator of `clip_dcl/losses/prior.py` on all image-to-caption negatives, and "
            "scikit-learn's "
            "`GaussianMixture` (k-means start, 3 restarts) on the same scores; the positive "
            "pairs' mean logit; per relation, the mean ± sd of the negatives' logits and their share; the estimator "
            "on the same-class and neither negatives alone (a clean two-class mixture) and that mixture's true weight.",
            "",
            table(results, truth),
            "",
            "Per seed (estimate / scikit-learn fit): "
            + "; ".join(
                f"{run} " + ", ".join(f"{r['estimate']:.2f} / {r['sklearn_estimate']:.2f}" for r in rows)
                for run, rows in results.items()
                if rows
            ),
        ]
    )
    report.write(md, {"samples": args.samples, "true_tau_plus": truth, "results": results})
    print(md)
    return 0


# ------------------------------------------------------------------------------------------
# The README's numbers (benchmarks/quotes.py)
# ------------------------------------------------------------------------------------------
def readme_block(doc: dict, run: str = "dcl tau+=0.25") -> str:
    """The README's sentence: how the negatives' relations score, and the two mixture estimates, for ``run``."""
    rows = doc["results"][run]

    def mean(key):
        return sum(r[key]["mean"] for r in rows) / len(rows)

    def span(key):
        vals = [r[key] for r in rows]
        return f"{min(vals):.2f}-{max(vals):.2f}"

    return (
        f"On {doc['samples']} pairs, for `{run}` ({len(rows)} checkpoints; true prior "
        f"{doc['true_tau_plus']:g}): mean logit of same-class negatives {mean('same class'):.1f}, same colour only "
        f"{mean('same colour only'):.1f}, same shape only {mean('same shape only'):.1f}, neither "
        f"{mean('neither'):.1f}. The EM estimate of the prior: {span('estimate')}; scikit-learn's "
        f"`GaussianMixture` from a k-means start: {span('sklearn_estimate')}."
    )


if __name__ == "__main__":
    raise SystemExit(main())
