"""One options object for every evaluator: ``EvalOptions`` gives the same numbers as the keywords
it replaces, the keywords still work and override it, and a wrong name or value is refused by name."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
from test_eval_benchmark_layout import _classification_set, _retrieval_set
from test_evalsets import ToyCLIP, ToyTokenizer, colour_split, to_tensor, write_iris

from clip_dcl.data import evalsets as es
from clip_dcl.eval import EvalOptions
from clip_dcl.eval.encoding import encode_texts, zeroshot_classifier
from clip_dcl.eval.fewshot import evaluate_fewshot, run_fewshot
from clip_dcl.eval.retrieval import evaluate_retrieval
from clip_dcl.eval.zeroshot import evaluate_zeroshot

#: Settings that differ from every default, so that an option that does not arrive shows.
SETTINGS = {"batch_size": 3, "device": "cpu", "workers": 0, "progress": False, "precision": "amp_bf16"}


class Recorder(ToyCLIP):
    """ToyCLIP that notes each image batch's size and the autocast dtype it ran under."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def encode_image(self, x, normalize=False):
        dtype = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None
        self.seen.append((x.shape[0], dtype))
        return super().encode_image(x, normalize)


def _both(call):
    """``call(model, **kw)`` with the settings as keywords, then as one options object:
    (result, batches seen) of each."""
    by_keywords, by_options = Recorder(), Recorder()
    a = call(by_keywords, **SETTINGS)
    b = call(by_options, options=EvalOptions(**SETTINGS))
    assert by_keywords.seen and by_keywords.seen[0] == (3, torch.bfloat16)  # the settings arrived
    return (a, by_keywords.seen), (b, by_options.seen)


def test_retrieval_with_options_equals_keywords(tmp_path):
    _retrieval_set(tmp_path / "coco", n=8, captions=2)
    keywords, options = _both(
        lambda m, **kw: evaluate_retrieval(
            m, to_tensor, ToyTokenizer(), tmp_path / "coco", ks=(1, 2), return_info=True, **kw
        )
    )
    assert keywords == options


def test_zeroshot_with_options_equals_keywords(tmp_path):
    _classification_set(tmp_path / "wds", tree=tmp_path / "tree")
    for root in (tmp_path / "wds", tmp_path / "tree"):
        keywords, options = _both(
            lambda m, **kw: evaluate_zeroshot(m, to_tensor, ToyTokenizer(), root, return_info=True, **kw)
        )
        assert keywords == options


def test_fewshot_with_options_equals_keywords(tmp_path):
    names = ["red", "green", "blue"]
    write_iris(tmp_path / "colours", names, colour_split(names, 4), colour_split(names, 2, seed=1))

    def call(model, **kw):
        report = run_fewshot(model, to_tensor, ToyTokenizer(), tmp_path, shots=2, seeds=(0,), grid="reduced", **kw)
        report.settings.pop("seconds")
        return json.dumps(report.to_dict(), sort_keys=True)  # the skipped sweep runs' NaN compare equal as text

    keywords, options = _both(call)
    assert keywords == options
    assert json.loads(keywords[0])["settings"]["precision"] == "amp_bf16"
    assert (
        evaluate_fewshot(
            Recorder(),
            to_tensor,
            ToyTokenizer(),
            tmp_path,
            shots=2,
            seeds=(0,),
            grid="reduced",
            options=EvalOptions(**SETTINGS),
        )
        == json.loads(keywords[0])["metrics"]
    )


def test_keywords_override_the_options_fields():
    base = EvalOptions(batch_size=8, progress=False, strict=True)
    merged = EvalOptions.from_kwargs(base, batch_size=2, precision="amp_fp16")
    assert merged == EvalOptions(batch_size=2, progress=False, strict=True, precision="amp_fp16")
    assert base.batch_size == 8  # frozen: the shared object is left as it was
    assert EvalOptions.from_kwargs(base) is base and EvalOptions.from_kwargs(None) == EvalOptions()
    with pytest.raises(dataclasses.FrozenInstanceError):
        base.batch_size = 4


def test_strict_as_an_option_raises_at_a_bad_sample(tmp_path):
    names = ["red", "green"]
    folder = write_iris(tmp_path / "colours", names, colour_split(names, 3), colour_split(names, 1), in_zip=False)
    bad = folder / (folder / "test.txt").read_text().splitlines()[0].rsplit(" ", 1)[0]
    bad.write_bytes(b"not a png")
    with pytest.raises(es.SampleSkipped, match="undecodable image"):
        run_fewshot(
            ToyCLIP(),
            to_tensor,
            ToyTokenizer(),
            tmp_path,
            shots=2,
            seeds=(0,),
            grid="reduced",
            options=EvalOptions(progress=False, strict=True),
        )
    report = run_fewshot(
        ToyCLIP(),
        to_tensor,
        ToyTokenizer(),
        tmp_path,
        shots=2,
        seeds=(0,),
        grid="reduced",
        options=EvalOptions(progress=False, strict=True),
        strict=False,
    )
    assert report.skipped == {"undecodable image": 1}


def test_text_batches_keep_their_own_size():
    """``encode_texts``'s batch counts texts; the options' (images) leave it alone."""
    calls = []

    class Counting(ToyCLIP):
        def encode_text(self, tokens, normalize=False):
            calls.append(tokens.shape[0])
            return super().encode_text(tokens, normalize)

    texts = ["red"] * 5
    encode_texts(Counting(), ToyTokenizer(), texts, options=EvalOptions(batch_size=1, progress=False), batch_size=2)
    assert calls == [2, 2, 1]


@pytest.mark.parametrize(
    "call",
    [
        lambda: evaluate_retrieval(ToyCLIP(), to_tensor, ToyTokenizer(), "unused", batchsize=4),
        lambda: evaluate_zeroshot(ToyCLIP(), to_tensor, ToyTokenizer(), "unused", batchsize=4),
        lambda: evaluate_fewshot(ToyCLIP(), to_tensor, ToyTokenizer(), "unused", batchsize=4),
        lambda: run_fewshot(ToyCLIP(), to_tensor, ToyTokenizer(), "unused", batchsize=4),
        lambda: zeroshot_classifier(ToyCLIP(), ToyTokenizer(), ["red"], ["a {c}"], batchsize=4),
        lambda: EvalOptions.from_kwargs(None, batchsize=4),
    ],
)
def test_an_unknown_keyword_is_named(call):
    with pytest.raises(TypeError, match=r"unexpected keyword argument\(s\) \['batchsize'\].*did you mean 'batch_size'"):
        call()


def test_options_of_the_wrong_type_or_value_are_refused_by_name():
    with pytest.raises(TypeError, match=r"options must be an EvalOptions or None, got int 64"):
        evaluate_retrieval(ToyCLIP(), to_tensor, ToyTokenizer(), "unused", options=64)
    for bad, match in (
        ({"batch_size": 0}, "batch_size must be an integer >= 1, got 0"),
        ({"batch_size": 2.5}, "batch_size must be an integer >= 1, got 2.5"),
        ({"workers": -1}, "workers must be an integer >= 0, got -1"),
        ({"precision": "fp8"}, r"precision must be one of .*got 'fp8'"),
    ):
        with pytest.raises(ValueError, match=match):
            EvalOptions(**bad)
    assert EvalOptions(batch_size=np.int64(4)).batch_size == 4
