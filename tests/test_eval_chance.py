"""Scores read against chance: the chance level of each retrieval and zero-shot metric, its noise, and the marks
"near chance" and "meaningless", on small tensors through the metric functions and the tables."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from clip_dcl.eval.metrics import (
    NOISE_SE,
    against_chance,
    classification_chance,
    classification_metrics,
    retrieval_chance,
    retrieval_metrics,
)


def _random_retrieval(t2i, n_img, trials, ks, seed=0):
    """Per metric, the scores of ``trials`` content-blind embeddings."""
    g = torch.Generator().manual_seed(seed)
    scores = {}
    for _ in range(trials):
        img = F.normalize(torch.randn(n_img, 16, generator=g), dim=-1)
        txt = F.normalize(torch.randn(len(t2i), 16, generator=g), dim=-1)
        for key, value in retrieval_metrics(img, txt, t2i, ks=ks).items():
            scores.setdefault(key, []).append(value)
    return {key: torch.tensor(v, dtype=torch.double) for key, v in scores.items()}


@pytest.mark.parametrize("counts", [[1] * 10, [2] * 6, [1, 3, 2, 1, 1, 4, 2]])
def test_retrieval_chance_and_its_noise_are_what_random_embeddings_score(counts):
    n_img = len(counts)
    t2i = torch.repeat_interleave(torch.arange(n_img), torch.tensor(counts))
    t2i = t2i[torch.randperm(len(t2i), generator=torch.Generator().manual_seed(1))]
    ks = (1, 3)
    levels = retrieval_chance(t2i, n_img, ks)
    scores = _random_retrieval(t2i, n_img, trials=400, ks=ks)
    for key, (level, se, queries) in levels.items():
        assert queries == (n_img if key.startswith(("image_to_text", "text_retrieval")) else len(t2i)), key
        assert scores[key].mean() == pytest.approx(level, abs=4 * se / 20), key  # 400 trials: se / 20 each
        assert scores[key].std() == pytest.approx(se, rel=0.2), key
    if len(set(counts)) == 1 and counts[0] == 1:  # 1:1 pairs: k / N both ways
        assert levels["image_to_text_R@3"][0] == pytest.approx(3 / n_img) == levels["text_to_image_R@3"][0]


def test_classification_chance_is_k_over_classes_and_its_noise_what_a_blind_classifier_scores():
    g = torch.Generator().manual_seed(0)
    classes, n = 8, 40
    labels = torch.arange(n) % classes  # balanced: mean per-class recall's noise is exact
    runs = [classification_metrics(torch.randn(n, classes, generator=g), labels) for _ in range(400)]
    for key, (level, se, queries) in classification_chance(classes, n).items():
        if key in runs[0]:
            got = torch.tensor([r[key] for r in runs], dtype=torch.double)
            assert got.mean() == pytest.approx(level, abs=4 * se / 20), key
            assert got.std() == pytest.approx(se, rel=0.2), key
        assert queries == n
    assert classification_chance(classes, n)["acc5"][0] == 5 / classes


def test_a_score_within_noise_of_chance_is_marked_and_a_real_one_is_not():
    n = 40
    perfect = F.normalize(torch.randn(n, 8, generator=torch.Generator().manual_seed(0)), dim=-1)
    levels = retrieval_chance(torch.arange(n), n, (1, 5))
    good = against_chance(retrieval_metrics(perfect, perfect, ks=(1, 5)), levels)
    assert good["image_to_text_R@1"]["mark"] is None and good["text_retrieval_recall@1"]["mark"] is None
    assert good["image_to_text_R@1"]["chance"] == pytest.approx(1 / n)
    blind = {"image_to_text_R@1": 1 / n, "text_to_image_R@1": 0.0, "image_to_text_R@5": 0.5}
    marks = against_chance(blind, levels)
    assert marks["image_to_text_R@1"]["mark"] == "near chance"  # 1/40: chance itself
    assert marks["text_to_image_R@1"]["mark"] == "near chance"  # 0 of 40: within 2 se of 1/40
    assert marks["image_to_text_R@5"]["mark"] is None  # 0.5 against 0.125
    se = levels["image_to_text_R@1"][1]
    assert marks["image_to_text_R@1"]["noise"] == pytest.approx(NOISE_SE * se)
    assert set(marks) == set(blind)  # only the metrics given


def test_recall_at_or_above_the_candidates_and_top1_of_one_class_are_meaningless():
    one = F.normalize(torch.randn(1, 8), dim=-1)
    metrics = retrieval_metrics(one, one, ks=(1, 5))
    assert metrics["image_to_text_R@1"] == 1.0  # one pair: every model finds it
    marks = against_chance(metrics, retrieval_chance(torch.arange(1), 1, (1, 5)))
    assert {m["mark"] for m in marks.values()} == {"meaningless"}
    eight = F.normalize(torch.randn(8, 8), dim=-1)
    marks = against_chance(
        retrieval_metrics(eight, eight.flip(0), ks=(1, 8, 10)), retrieval_chance(torch.arange(8), 8, (1, 8, 10))
    )
    assert marks["text_to_image_R@10"]["mark"] == marks["text_to_image_R@8"]["mark"] == "meaningless"
    assert marks["text_to_image_R@1"]["mark"] != "meaningless"
    two_captions = torch.tensor([0, 0, 1, 1])  # image -> text over 4 texts, 2 true: any 3 hold one of them
    assert retrieval_chance(two_captions, 2, (3,))["image_to_text_R@3"][0] == 1.0
    assert retrieval_chance(two_captions, 2, (2,))["image_to_text_R@2"][0] == pytest.approx(1 - 1 / 6)
    zs = classification_metrics(torch.randn(5, 1), torch.zeros(5, dtype=torch.long))
    marks = against_chance(zs, classification_chance(1, 5))
    assert zs["top1"] == 1.0 and marks["top1"]["mark"] == marks["mean_per_class_recall"]["mark"] == "meaningless"
    marks = against_chance(classification_metrics(torch.randn(6, 5), torch.arange(6) % 5), classification_chance(5, 6))
    assert marks["top5"]["mark"] == "meaningless" and marks["top1"]["mark"] != "meaningless"


def test_the_tables_show_chance_and_say_what_each_mark_means():
    from clip_dcl.eval.retrieval import retrieval_table
    from clip_dcl.eval.zeroshot import zeroshot_table

    metrics = {
        f"{d}_{k}": v
        for d in ("image_to_text", "text_to_image")
        for k, v in (("R@1", 0.125), ("R@10", 1.0), ("mean_rank", 4.0), ("median_rank", 4.0))
    }
    chance = against_chance(metrics, retrieval_chance(torch.arange(8), 8, (1, 10)))
    lines = retrieval_table(metrics, (1, 10), chance).splitlines()
    assert lines[2].split() == ["image", "->", "text", "0.1250", "*", "1.0000", "!", "4.0000", "4.0000"]
    assert lines[3].split() == ["chance", "0.1250", "1.0000"]
    assert lines[-2].startswith("* within noise of chance") and lines[-1].startswith("! meaningless")
    assert "chance" not in retrieval_table(metrics, (1, 10))  # no levels given: the plain table
    zs = {"top1": 0.9, "top5": 1.0, "mean_per_class_recall": 0.25}
    lines = zeroshot_table(zs, None, against_chance(zs, classification_chance(4, 400))).splitlines()
    assert lines[0].split() == ["metric", "value", "chance"]
    assert lines[2].split() == ["top1", "0.9000", "0.2500"] and lines[3].split() == ["top5", "1.0000", "!", "1.0000"]
    assert lines[4].split() == ["mean_per_class_recall", "0.2500", "*", "0.2500"]
