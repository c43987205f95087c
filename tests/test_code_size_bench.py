"""benchmarks/code_size.py: how it tells a line's kind, and that every file of the trainer has its concern."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import code_size  # noqa: E402

SOURCE = '''"""A module's docstring,
on two lines."""

# a comment line
import os  # a comment after code is code


class A:
    """One line."""

    x = "a string that is no docstring"

    def f(self):
        """Two
        lines."""
        "a second string: code"
        return os.sep
'''


def test_each_line_is_counted_as_one_kind():
    counts = code_size.line_kinds(SOURCE)
    assert counts == {"docstring": 5, "comment": 1, "blank": 5, "code": 6, "total": 17}


def test_every_file_of_the_trainer_is_given_a_concern():
    train = Path(code_size.ROOT, "clip_dcl", "train")
    assert [p.name for p in sorted(train.glob("*.py")) if code_size.concern_of(str(p)) == "other"] == []
