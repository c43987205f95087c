"""Zero-shot classification: metrics against scikit-learn, class-name resolution, the evaluator and CLI."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from test_evalsets import COLOURS, ToyCLIP, ToyTokenizer, to_tensor, write_png

from clip_dcl.eval.metrics import classification_metrics, mean_per_class_recall, topk_accuracy
from clip_dcl.eval.zeroshot import evaluate_zeroshot, resolve_classnames


@pytest.mark.parametrize("seed", range(5))
def test_classification_metrics_match_sklearn(seed):
    from sklearn.metrics import balanced_accuracy_score, top_k_accuracy_score

    g = torch.Generator().manual_seed(seed)
    n, c = 200, 12
    labels = torch.randint(0, c - 2, (n,), generator=g)  # two classes never occur
    logits = torch.randn(n, c, generator=g) + 2.0 * torch.nn.functional.one_hot(labels, c)
    m = classification_metrics(logits, labels)
    y, s = labels.numpy(), logits.numpy()
    assert m["top1"] == pytest.approx(top_k_accuracy_score(y, s, k=1, labels=np.arange(c)))
    assert m["top5"] == pytest.approx(top_k_accuracy_score(y, s, k=5, labels=np.arange(c)))
    with pytest.warns(UserWarning):  # sklearn: predictions hold classes absent from y_true
        ref = balanced_accuracy_score(y, s.argmax(1))
    assert m["mean_per_class_recall"] == pytest.approx(ref)


def test_hand_built_mean_per_class_recall_and_top5_nan():
    labels = torch.tensor([0, 0, 0, 0, 1, 2])
    preds = torch.tensor([0, 0, 0, 0, 0, 2])  # class 0: 4/4, class 1: 0/1, class 2: 1/1
    assert mean_per_class_recall(preds, labels) == pytest.approx(2 / 3)
    assert math.isnan(topk_accuracy(torch.randn(6, 4), labels, 5))
    assert topk_accuracy(torch.randn(6, 4), labels, 4) == 1.0
    assert math.isnan(classification_metrics(torch.randn(6, 4), labels)["top5"])


def test_imagenet_names_for_synset_folders_and_errors(tmp_path):
    from open_clip.zero_shot_metadata import IMAGENET_CLASSNAMES

    synsets = [f"n{i:08d}" for i in range(1000)]
    names, source = resolve_classnames(tmp_path, synsets)
    assert names == list(IMAGENET_CLASSNAMES) and "IMAGENET_CLASSNAMES" in source
    # OpenCLIP's own list written out for the synset folders is their standard order: accepted
    (tmp_path / "classnames.txt").write_text("\n".join(IMAGENET_CLASSNAMES) + "\n")
    assert resolve_classnames(tmp_path, synsets)[0] == list(IMAGENET_CLASSNAMES)
    # no class-name file and no synsets: the folder names, as `clip-dcl data benchmark` takes them
    assert resolve_classnames(tmp_path / "none", ["cat", "dog"]) == (["cat", "dog"], "the folder names")
    (tmp_path / "classnames.txt").write_text("cat\n")
    with pytest.raises(ValueError, match=r"classnames.txt count 1, but .* has 2 class folders"):
        resolve_classnames(tmp_path, ["cat", "dog"])
    assert resolve_classnames(tmp_path, ["a_x"], ["x"]) == (["x"], "argument")


def test_a_name_list_must_name_each_folder_in_sorted_order(tmp_path):
    folders = ["003_big_circle", "golden_retriever", "tabby"]
    assert (
        resolve_classnames(tmp_path, folders, ["big circle", "Golden Retriever", "tabby"])[0][1] == "Golden Retriever"
    )
    # the user's own order: refused, naming the line, the folder it names and the folder of that label
    with pytest.raises(
        ValueError,
        match=r"not in sorted folder order: line 1, 'tabby', names folder 'tabby', but "
        r"label 0 is folder '003_big_circle'.*classnames.json",
    ):
        resolve_classnames(tmp_path, folders, ["tabby", "big circle", "golden retriever"])
    # names that are not the folders' (synset ids, numbers): their order cannot be checked
    with pytest.raises(
        ValueError,
        match=r"line 1, 'tench', does not name folder 'n01440764' .*cannot be checked.*"
        r"classnames.json.*\{\"n01440764\": \"...\"",
    ):
        resolve_classnames(tmp_path, ["n01440764", "n01443537"], ["tench", "goldfish"])


def test_a_folder_to_name_mapping_in_any_order(tmp_path):
    folders = ["n01440764", "n01443537"]
    (tmp_path / "classnames.json").write_text(json.dumps({"n01443537": "goldfish", "n01440764": "tench"}))
    assert resolve_classnames(tmp_path, folders) == (["tench", "goldfish"], str(tmp_path / "classnames.json"))
    assert resolve_classnames(tmp_path, folders, {"n01443537": "b", "n01440764": "a"})[0] == ["a", "b"]
    with pytest.raises(ValueError, match=r"no name for the folder\(s\) \['n01443537'\]; names for \['n9'\] that"):
        resolve_classnames(tmp_path, folders, {"n01440764": "tench", "n9": "x"})
    bad = tmp_path / "bad.json"
    bad.write_text('{"n01440764": 3}')
    with pytest.raises(ValueError, match="must hold a JSON object mapping each class folder to its name"):
        resolve_classnames(tmp_path, folders, bad)


def _colour_tree(root, names, per_class=3):
    for c in names:
        for i in range(per_class):
            write_png(root / f"{c}_folder" / f"{i}.png", COLOURS[c], noise=20, seed=i)
    return root


def test_evaluate_zeroshot_uses_folder_order_for_names(tmp_path):
    names = ["blue", "green", "red", "yellow"]
    root = _colour_tree(tmp_path / "zs", names)
    (root / "classnames.txt").write_text("\n".join(names) + "\n")
    (root / "templates.txt").write_text("a {c} patch\nsomething {c}\n")
    m, info = evaluate_zeroshot(ToyCLIP(), to_tensor, ToyTokenizer(), root, progress=False, return_info=True)
    assert m["top1"] == 1.0 and m["mean_per_class_recall"] == 1.0 and math.isnan(m["top5"])
    assert info["num_images"] == 12 and info["num_templates"] == 2
    # Names in another order (blue<->green swapped) would score those two classes always wrong: refused.
    swapped = ["green", "blue", "red", "yellow"]
    with pytest.raises(ValueError, match="not in sorted folder order: line 1, 'green', names folder 'green_folder'"):
        evaluate_zeroshot(ToyCLIP(), to_tensor, ToyTokenizer(), root, classnames=swapped, progress=False)
    # The same names as a mapping, written in that order: each folder gets its own name.
    mapping = {f"{c}_folder": c for c in swapped}
    mapped = evaluate_zeroshot(ToyCLIP(), to_tensor, ToyTokenizer(), root, classnames=mapping, progress=False)
    assert mapped["top1"] == mapped["mean_per_class_recall"] == 1.0
    # Without any class-name file the folder names are the names.
    plain = tmp_path / "plain"
    plain.mkdir()
    for c in names:
        (root / f"{c}_folder").rename(plain / c)
    m2, info = evaluate_zeroshot(ToyCLIP(), to_tensor, ToyTokenizer(), plain, progress=False, return_info=True)
    assert info["classnames"] == names and info["classnames_source"] == "the folder names"
    assert m2["top1"] == 1.0


def test_cli_refuses_misaligned_names_before_the_model_loads(tmp_path, monkeypatch, capsys):
    from clip_dcl.eval import cli

    names = ["blue", "green", "red"]
    root = _colour_tree(tmp_path / "zs", names, per_class=1)
    (root / "classnames.txt").write_text("red\nblue\ngreen\n")  # the user's own order

    def no_model(args):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(cli, "_load_model", no_model)
    assert cli.main(["zeroshot", "--model", "clip-dcl-tiny", "--data", str(root), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err.startswith("clip-dcl eval zeroshot: class names from ")
        and "line 1, 'red', names folder 'red_folder', but label 0 is folder 'blue_folder'" in err
        and len(err.splitlines()) == 1
    )
    assert cli.main(["zeroshot", "--model", "clip-dcl-tiny", "--data", str(tmp_path / "nothing")]) == 2
    assert "is in neither layout" in capsys.readouterr().err


def test_zeroshot_cli_with_tiny_model(tmp_path, capsys):
    from clip_dcl.eval.cli import main

    names = ["blue", "green", "red", "yellow", "purple", "cyan"]
    root = _colour_tree(tmp_path / "zs", names, per_class=2)
    (root / "classnames.txt").write_text("\n".join(sorted(names)) + "\n")  # label order: the sorted folders
    (root / "templates.txt").write_text("a photo of a {c} thing.\n")
    out = tmp_path / "z.json"
    assert (
        main(
            [
                "zeroshot",
                "--model",
                "clip-dcl-tiny",
                "--data",
                str(root),
                "--output",
                str(out),
                "--no-progress",
                "--batch-size",
                "5",
            ]
        )
        == 0
    )
    doc = json.loads(out.read_text())
    assert {"top1", "top5", "mean_per_class_recall", "model", "data", "settings"} <= doc.keys()
    assert doc["data"]["num_classes"] == 6 and doc["settings"]["num_templates"] == 1
    assert 0 <= doc["top1"] <= doc["top5"] <= 1
    # 6 classes, 12 images: top-1 by chance 1/6, top-5 5/6, each over the 12 images
    assert doc["chance"]["acc1"]["chance"] == pytest.approx(1 / 6) and doc["chance"]["top1"]["queries"] == 12
    assert doc["chance"]["top5"]["chance"] == pytest.approx(5 / 6) and doc["chance"]["top5"]["mark"] != "meaningless"
    printed = capsys.readouterr().out
    assert "metric" in printed and " chance" in printed.splitlines()[0], printed
    (root / "classnames.txt").write_text("just one\n")
    assert main(["zeroshot", "--model", "clip-dcl-tiny", "--data", str(root), "--no-progress"]) == 2
    assert main(["zeroshot", "--model", "clip-dcl-tiny", "--data", str(root), "--device", "gpu0"]) == 2
    assert main(["zeroshot", "--model", "clip-dcl-tiny", "--data", str(root), "--batch-size", "0"]) == 2
