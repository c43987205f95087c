"""Your own images and captions: `clip-dcl data shards` from a folder of image + .txt pairs, a CSV or a folder of
class folders, then the training and evaluation commands it prints; the same CSV read by training and by evaluation."""

from __future__ import annotations

import contextlib
import io
import json
import re
import shlex

import pytest
from PIL import Image

from clip_dcl.cli import main as clip_dcl

TRAIN = [
    "--model",
    "clip-dcl-tiny",
    "--epochs",
    "1",
    "--lr",
    "1e-3",
    "--warmup",
    "1",
    "--workers",
    "0",
    "--seed",
    "0",
    "--report-to",
    "",
]


def run(argv, cwd=None, monkeypatch=None):
    """``clip-dcl ARGV`` in this process: (exit code, stdout, stderr)."""
    if cwd is not None:
        monkeypatch.chdir(cwd)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = clip_dcl([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


def write_pairs(folder, n, caption=lambda i: f"a square of shade {i} on a plain ground"):
    """``n`` 16x16 PNGs, each with its caption in a .txt of the same stem."""
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        Image.new("RGB", (16, 16), ((37 * i) % 256, (11 * i) % 256, (91 * i) % 256)).save(folder / f"img{i:03d}.png")
        (folder / f"img{i:03d}.txt").write_text(caption(i) + "\n")


@pytest.mark.slow
def test_a_folder_of_pngs_and_captions_trains_decl_and_evaluates_with_the_printed_commands(tmp_path, monkeypatch):
    write_pairs(tmp_path / "my_images", 300)
    Image.new("RGB", (8, 8)).save(tmp_path / "my_images" / "uncaptioned.png")
    (tmp_path / "my_images" / "broken.png").write_bytes(b"not an image")
    (tmp_path / "my_images" / "broken.txt").write_text("a caption of a broken file")
    code, out, err = run(["data", "shards", "my_images", "my_shards"], cwd=tmp_path, monkeypatch=monkeypatch)
    assert code == 0, err
    assert re.search(r"^train: 27[01] pairs in 1 shard\(s\), my_shards/train$", out, re.M), out
    assert "skipped: 2" in out and "no caption: 1" in out and "undecodable image: 1" in out, out
    summary = json.loads((tmp_path / "my_shards" / "summary.json").read_text())
    assert summary["splits"]["train"]["pairs"] + summary["splits"]["val"]["pairs"] == 300
    commands = [line.strip() for line in out.splitlines() if line.strip().startswith("clip-dcl ")]
    train, evaluate = commands
    assert "--loss decl" in train and "--train-data my_shards/train" in train and "--data my_shards/val" in evaluate
    # one epoch instead of the printed ten: the same command otherwise
    train = train.replace("--epochs 10", "--epochs 1")
    evaluate = evaluate.replace("epoch_10.pt", "epoch_1.pt")
    code, _, err = run(shlex.split(train)[1:])
    assert code == 0, err[-3000:]
    assert "pin_memory" not in err  # torch's warning of a loader on a machine without a GPU
    code, out, err = run(shlex.split(evaluate)[1:] + ["--no-progress"])
    assert code == 0, err[-3000:]
    assert "image -> text" in out and "text -> image" in out


def test_training_and_evaluation_given_the_folder_itself_name_the_command(tmp_path, monkeypatch):
    write_pairs(tmp_path / "pics", 3)
    code, _, err = run(
        ["train", "--loss", "decl", "--train-data", "pics", *TRAIN], cwd=tmp_path, monkeypatch=monkeypatch
    )
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "clip-dcl data shards pics OUT" in err
    code, _, err = run(["eval", "retrieval", "--model", "clip-dcl-tiny", "--data", "pics"])
    assert code == 2 and "clip-dcl data shards pics OUT" in err and "Traceback" not in err, err


def test_shards_from_a_tab_csv_group_an_images_captions_and_name_what_they_skip(tmp_path):
    from clip_dcl.data.pairs import CsvColumns, csv_columns
    from clip_dcl.data.pairs import write_pairs as write

    write_pairs(tmp_path / "img", 4)
    (tmp_path / "pairs.tsv").write_text(
        "filepath\ttitle\nimg/img000.png\tone\nimg/img001.png\ttwo\n"
        "img/img000.png\tone again\nimg/gone.png\tlost\nimg/img002.png\t \n"
        "img/img003.png\tthree\n"
    )
    summary = write(tmp_path / "pairs.tsv", tmp_path / "out", val_fraction=0, verbose=False)
    assert summary["splits"]["train"]["pairs"] == 3 and "val" not in summary["splits"]
    assert summary["skipped"]["image not found"]["count"] == 1 and summary["skipped"]["empty caption"]["count"] == 1
    import tarfile

    with tarfile.open(tmp_path / "out" / "train" / "00000.tar") as tar:
        docs = [json.loads(tar.extractfile(m).read()) for m in tar.getmembers() if m.name.endswith(".json")]
    assert sorted(len(d["captions"]) for d in docs) == [1, 1, 2]
    assert csv_columns(tmp_path / "pairs.tsv") == CsvColumns("\t", "filepath", "title", ["filepath", "title"])
    with pytest.raises(ValueError, match="already holds train, summary.json: give --overwrite"):
        write(tmp_path / "pairs.tsv", tmp_path / "out", val_fraction=0, verbose=False)


def test_a_comma_csv_with_other_columns_is_refused_in_one_line_naming_the_flags(tmp_path, monkeypatch):
    write_pairs(tmp_path / "img", 2)
    (tmp_path / "pairs.csv").write_text("picture,words\nimg/img000.png,one\nimg/img001.png,two\n")
    for loss in ("clip", "decl"):
        code, _, err = run(
            ["train", "--loss", loss, "--train-data", "pairs.csv", "--batch-size", "2", *TRAIN],
            cwd=tmp_path,
            monkeypatch=monkeypatch,
        )
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1, err[-3000:]
        assert "'picture', 'words'" in lines[0] and "--csv-img-key" in lines[0] and "--csv-caption-key" in lines[0]
        assert "Traceback" not in err and "--decl-num-samples" not in err and "KeyError" not in err


@pytest.mark.slow
def test_the_csv_evaluation_reads_trains_from_any_folder(tmp_path, monkeypatch):
    """header image,caption, comma-separated, image paths relative to the CSV: what `eval retrieval --data` reads."""
    data = tmp_path / "data"
    write_pairs(data / "img", 32)
    rows = "".join(f'img/img{i:03d}.png,"a square, shade {i}"\n' for i in range(32))
    (data / "pairs.csv").write_text("image,caption\n" + rows)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    code, _, err = run(
        [
            "train",
            "--loss",
            "decl",
            "--train-data",
            data / "pairs.csv",
            "--batch-size",
            "16",
            "--logs",
            "logs",
            "--name",
            "csv",
            *TRAIN,
        ],
        cwd=elsewhere,
        monkeypatch=monkeypatch,
    )
    assert code == 0, err[-3000:]
    assert (elsewhere / "logs" / "csv" / "checkpoints" / "epoch_1.pt").is_file()
    params = (elsewhere / "logs" / "csv" / "params.txt").read_text()
    assert "csv_img_key: image" in params and "csv_caption_key: caption" in params and "csv_separator: ," in params


def write_class_tree(root, classes, per_class):
    """``per_class`` 16x16 JPEGs in a folder of each class, no caption: ImageFolder's layout."""
    for c, name in enumerate(classes):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            Image.new("RGB", (16, 16), ((80 * c + 9 * i) % 256, (40 * c) % 256, (150 + 7 * i) % 256)).save(
                root / name / f"{i}.jpg"
            )


def test_class_folders_give_a_zero_shot_set_that_the_printed_eval_command_reads(tmp_path, monkeypatch, trained_run):
    import tarfile

    write_class_tree(tmp_path / "pets", ["golden_retriever", "tabby-cat", "003.red_fox"], per_class=5)
    code, out, err = run(["data", "shards", "pets", "pet_shards"], cwd=tmp_path, monkeypatch=monkeypatch)
    assert code == 0, err
    assert "zeroshot: 3 images of 3 classes, pet_shards/zeroshot" in out, out  # one of each class held out
    zeroshot = tmp_path / "pet_shards" / "zeroshot"
    assert (zeroshot / "classnames.txt").read_text().splitlines() == ["red fox", "golden retriever", "tabby cat"]
    assert "a photo of a {c}." in (zeroshot / "templates.txt").read_text().splitlines()
    assert [len(list(d.iterdir())) for d in sorted(zeroshot.iterdir()) if d.is_dir()] == [1, 1, 1]
    with tarfile.open(tmp_path / "pet_shards" / "train" / "00000.tar") as tar:
        captions = sorted({tar.extractfile(m).read().decode() for m in tar.getmembers() if m.name.endswith(".txt")})
    assert captions == ["a photo of a golden retriever.", "a photo of a red fox.", "a photo of a tabby cat."]
    commands = [line.strip() for line in out.splitlines() if line.strip().startswith("clip-dcl ")]
    assert [c.split()[:3] for c in commands] == [["clip-dcl", "train", "--loss"], ["clip-dcl", "eval", "zeroshot"]]
    # the printed command as it is, on a checkpoint the session has trained instead of the run it names
    argv = shlex.split(commands[1])[1:]
    argv[argv.index("--checkpoint") + 1] = str(trained_run("clip") / "checkpoints" / "epoch_1.pt")
    code, out, err = run(argv + ["--no-progress", "--output", "zs.json"])
    assert code == 0, err[-3000:]
    doc = json.loads((tmp_path / "zs.json").read_text())
    assert doc["data"]["num_classes"] == 3 and doc["data"]["num_images"] == 3
    assert doc["settings"]["classnames"].endswith("classnames.txt") and doc["settings"]["num_templates"] == 80


def test_class_folders_with_captions_stay_image_caption_pairs(tmp_path):
    from clip_dcl.data.classes import readable_classname
    from clip_dcl.data.pairs import write_pairs as write

    write_pairs(tmp_path / "src" / "2023-01", 3)
    write_pairs(tmp_path / "src" / "2023-02", 3)
    summary = write(tmp_path / "src", tmp_path / "out", val_fraction=0, verbose=False)
    assert summary["kind"] == "folder" and "zeroshot" not in summary and not (tmp_path / "out" / "zeroshot").exists()
    assert readable_classname("n01440764") == "n01440764" and readable_classname("12") == "12"


def test_printed_run_names_follow_the_data_and_never_collide(tmp_path, monkeypatch):
    from clip_dcl.data.pairs import run_name

    monkeypatch.chdir(tmp_path)
    assert run_name(tmp_path / "my_shards") == "my_shards-decl"
    assert run_name(tmp_path / "other_shards") == "other_shards-decl"
    (tmp_path / "logs" / "my_shards-decl").mkdir(parents=True)
    assert run_name(tmp_path / "my_shards") == "my_shards-decl-2"


def test_a_validation_split_that_decodes_to_nothing_is_said(tmp_path, capsys):
    from clip_dcl.data.pairs import write_pairs as write

    write_pairs(tmp_path / "img", 6)
    (tmp_path / "img" / "img000.png").write_bytes(b"not an image")  # every image but this one decodes
    lines = "".join(f"img/img{i:03d}.png\tcaption {i}\n" for i in range(6))
    (tmp_path / "pairs.tsv").write_text("filepath\ttitle\n" + lines)
    for seed in range(50):  # a draw whose one held-out pair is the undecodable one
        out = tmp_path / f"out{seed}"
        summary = write(tmp_path / "pairs.tsv", out, val_fraction=0.1, seed=seed, verbose=False)
        if "val" not in summary["splits"]:
            break
    else:
        pytest.fail("no draw held out the undecodable image")
    err = capsys.readouterr().err
    assert "no validation split: none of the 1 pair(s) held out for it decoded" in err
    assert summary["skipped"]["undecodable image"]["count"] == 1


def test_a_folder_data_shards_wrote_given_to_train_data_reads_its_train_split(tmp_path, capsys):
    from clip_dcl.data.pairs import write_pairs as write
    from clip_dcl.train.flags import parse_train_args

    write_pairs(tmp_path / "pics", 6)
    write(tmp_path / "pics", tmp_path / "my_shards", val_fraction=0.2, verbose=False)
    config = parse_train_args(
        ["--loss", "clip", "--workers", "1", "--batch-size", "2", "--train-data", str(tmp_path / "my_shards")]
    )
    words = config.openclip_argv
    assert words[words.index("--train-data") + 1].startswith(str(tmp_path / "my_shards" / "train" / "0"))
    assert f"--train-data {tmp_path / 'my_shards' / 'train'} is a folder: reading its shards" in capsys.readouterr().err


def test_data_shards_and_eval_skip_the_same_rows_of_a_csv_for_the_same_causes(tmp_path):
    import open_clip

    from clip_dcl.data.pairs import write_pairs as write
    from clip_dcl.eval.retrieval import evaluate_retrieval
    from clip_dcl.models import register_builtin_configs

    write_pairs(tmp_path / "img", 6)
    (tmp_path / "img" / "img005.png").write_bytes(b"\x89PNG\r\n\x1a\n not an image")
    rows = [f"img/img{i:03d}.png\tcaption {i}\n" for i in range(6)] + [
        "img/img000.png\t \n",
        "img/gone.png\tlost\n",
    ]
    (tmp_path / "pairs.tsv").write_text("filepath\ttitle\n" + "".join(rows))
    shards = write(tmp_path / "pairs.tsv", tmp_path / "out", val_fraction=0, verbose=False)
    register_builtin_configs()
    model, _, preprocess = open_clip.create_model_and_transforms("clip-dcl-tiny")
    _, info = evaluate_retrieval(
        model.eval(), preprocess, open_clip.get_tokenizer("clip-dcl-tiny"), tmp_path / "pairs.tsv",
        progress=False, return_info=True,
    )  # fmt: skip
    counted = {cause: entry["count"] for cause, entry in shards["skipped"].items()}
    assert counted == {"empty caption": 1, "image not found": 1, "undecodable image": 1}
    assert info["skipped"] == counted  # one vocabulary of causes: the same file, the same counts
