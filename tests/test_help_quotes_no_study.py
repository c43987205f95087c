"""The training flags' help and the loss summaries state what a flag does, never what a study found: the
findings live in the README's "What the studies found", which the help points to."""

from __future__ import annotations

import re

FINDING = re.compile(r"\bstudy\b|testbed|verdict|confirmatory|fashion-mnist|beaten|trailed", re.IGNORECASE)


def test_train_help_names_no_study_testbed_or_verdict():
    from clip_dcl.train.flags import build_parser

    text = build_parser().format_help()
    assert not FINDING.findall(text), FINDING.findall(text)
    assert "What the studies found" in " ".join(text.split())  # --tau-plus points there


def test_loss_summaries_and_flag_help_quote_no_study():
    from clip_dcl.losses import LOSSES

    for name, cls in LOSSES.items():
        assert not FINDING.search(cls.summary or ""), (name, cls.summary)
        for flag in cls.flags:
            assert not FINDING.search(flag.help or ""), (name, flag.help)
