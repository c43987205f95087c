"""The OpenCLIP release the suite runs with: `make test-upstream` runs the training, checkpoint and export tests
again with the oldest release clip-dcl supports, and names it in ``CLIP_DCL_EXPECT_OPENCLIP``."""

from __future__ import annotations

import os

import pytest


def test_the_release_under_test_is_the_one_asked_for_and_fits():
    from clip_dcl.train.compat import SUPPORTED_OPENCLIP, check_openclip, installed_version

    expected = os.environ.get("CLIP_DCL_EXPECT_OPENCLIP")
    version = installed_version()
    if expected is None:
        pytest.skip("no release asked for (make test-upstream names one)")
    assert version == expected
    assert SUPPORTED_OPENCLIP[0] <= tuple(int(p) for p in version.split(".")[:2]) < SUPPORTED_OPENCLIP[1]
    check_openclip()


def test_pyproject_admits_exactly_the_supported_releases():
    from pathlib import Path

    import tomllib

    from clip_dcl.train.compat import SUPPORTED_OPENCLIP

    deps = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
    pin = next(d for d in deps["dependencies"] if d.startswith("open_clip_torch"))
    (a, b), (c, d) = SUPPORTED_OPENCLIP
    assert pin == f"open_clip_torch>={a}.{b},<{c}.{d}"
