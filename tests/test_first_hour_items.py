"""Smaller things a first hour meets: the top-level help names every `data` subcommand, class folders read
underscores as spaces, zero-shot evaluation names the layout of image-caption data it was given, and
retrieval on captions that are mostly the same few texts warns."""

from __future__ import annotations

import logging

import pytest
from PIL import Image


def test_the_top_level_help_names_every_data_subcommand(capsys):
    import argparse

    from clip_dcl.cli import main
    from clip_dcl.data.cli import build_parser

    assert main(["--help"]) == 0
    data_line = next(line for line in capsys.readouterr().out.splitlines() if line.strip().startswith("data "))
    action = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    names = set(action.choices) | {"fashion-scenes"}
    assert {"synth", "fashion-mnist", "pack", "benchmark", "shards"} <= names
    missing = [n for n in names if f" {n} " not in data_line.replace("|", " ") + " "]
    assert not missing, data_line


def test_class_folders_read_underscores_as_spaces_unless_a_name_file_says_otherwise(tmp_path):
    from clip_dcl.data.evalsets import folder_classnames

    folders = ["ankle_boot", "t_shirt"]
    assert folder_classnames(tmp_path, folders) == (["ankle boot", "t shirt"], "the folder names")
    (tmp_path / "classnames.json").write_text('{"ankle_boot": "ankle boot", "t_shirt": "T-shirt"}')
    assert folder_classnames(tmp_path, folders)[0] == ["ankle boot", "T-shirt"]


def _shards(folder):
    import io

    from clip_dcl.data.shards import CaptionShardWriter

    buf = io.BytesIO()
    Image.new("RGB", (8, 8)).save(buf, format="PNG")
    with CaptionShardWriter(folder, shard_size=4) as w:
        for i in range(2):
            w.write(f"{i:09d}", buf.getvalue(), f"caption {i}", ext="png")
    return w.pattern


def test_zeroshot_given_caption_shards_names_their_layout_and_the_retrieval_command(tmp_path):
    from clip_dcl.eval.zeroshot import zeroshot_data

    pattern = _shards(tmp_path / "val")
    for data in (tmp_path / "val", pattern):
        with pytest.raises(ValueError) as e:
            zeroshot_data(str(data))
        assert "1 .tar shard(s) in img2dataset's layout" in str(e.value), e.value
        assert "clip-dcl eval retrieval --data" in str(e.value) and "does not exist" not in str(e.value)
    pics = tmp_path / "pics"
    pics.mkdir()
    Image.new("RGB", (8, 8)).save(pics / "a.png")
    (pics / "a.txt").write_text("a caption")
    with pytest.raises(ValueError, match=r"images with \.txt captions.*clip-dcl data shards"):
        zeroshot_data(str(pics))


def test_retrieval_warns_when_most_captions_are_the_same_few(caplog):
    from clip_dcl.eval.retrieval import duplicate_captions_warning

    with caplog.at_level(logging.WARNING):
        line = duplicate_captions_warning([f"caption {i % 20}" for i in range(300)], 300)
    assert line and "only 20 distinct captions among the 300 captions of 300 images" in line
    assert line in caplog.text
    assert duplicate_captions_warning([f"caption {i}" for i in range(300)], 300) is None
    assert duplicate_captions_warning([f"caption {i % 60}" for i in range(500)], 100) is None  # 60 for 100 images
