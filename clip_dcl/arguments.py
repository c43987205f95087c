"""The argument parser of the ``clip-dcl`` commands: flags spelled out in full, and a refusal in one line that
names the closest valid word: an unknown flag (``--batchsize`` -> ``--batch-size``), subcommand (``synt`` ->
``synth``) or choice (``DeCL`` -> ``decl``), before any work."""

from __future__ import annotations

import argparse
import difflib
import sys
from typing import Iterable, List, Optional, Sequence, Tuple


def misspelt_flag(words: Sequence[str], known: Iterable[str]) -> Optional[Tuple[str, List[str]]]:
    """``(word, the closest flags)`` for the first ``--word`` of ``words`` not in ``known`` that is close to
    some of them (up to three, best first), else None; words after ``--`` are positional."""
    known = sorted(set(known))
    for word in words:
        if word == "--":
            break
        name = word.split("=", 1)[0]
        if not name.startswith("--") or " " in name or name in known:
            continue
        close = difflib.get_close_matches(name, known, n=3, cutoff=0.7)
        if close:
            return name, close
    return None


def closest_word(word: str, words: Iterable[str]) -> Optional[str]:
    """The word of ``words`` closest to ``word``, letter case aside (difflib's ratio, at least 0.6), else None."""
    words = [str(w) for w in words]
    lowered = {w.lower(): w for w in reversed(words)}  # the first of words that differ only in case
    close = difflib.get_close_matches(str(word).lower(), list(lowered), n=1)
    return lowered[close[0]] if close else None


def not_one_of(word: str, words: Sequence[str], what: str) -> str:
    """The one-line refusal of ``word`` where one of ``words`` is due: ``'trian' is not a command; the closest:
    train (one of: ...)``."""
    words = [str(w) for w in words]
    close = closest_word(word, words)
    hint = f"; the closest: {close}" if close else ""
    return f"{word!r} is not {what}{hint} (one of: {', '.join(words)})"


def _subcommand(parser: argparse.ArgumentParser) -> Optional[argparse.Action]:
    return next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)


class FlagParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` without abbreviations whose errors are one line with no usage block before it
    (``--help`` has that), exit 2: a misspelt flag, subcommand or choice value named with the closest valid one.
    Subcommands' parsers are of this class too."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_args(self, args=None, namespace=None):
        args = list(sys.argv[1:] if args is None else args)
        parser = self
        for word in args:  # the subcommand's parser reads the words after its name
            sub = _subcommand(parser)
            if word == "--":
                break
            if sub is not None and word in sub.choices:
                parser = sub.choices[word]
                continue
            found = misspelt_flag([word], parser._option_string_actions)  # argparse has no public list of them
            if found:
                name, close = found
                parser.exit(2, f"{parser.prog}: error: {name} is not a flag; the closest: {', '.join(close)}\n")
        return super().parse_args(args, namespace)

    def _check_value(self, action, value):
        # argparse's one place that refuses a choice (a subcommand is one too); it has no hook for the message
        if action.choices is None or value in action.choices:
            return
        if isinstance(action, argparse._SubParsersAction):
            what = "a command"
        elif action.option_strings:
            what = f"a choice of {action.option_strings[-1]}"
        else:
            what = f"a choice of {action.metavar or action.dest}"
        raise argparse.ArgumentError(None, not_one_of(value, list(action.choices), what))

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def flag_words(options: dict, *, negate: bool = False, floats: str = "") -> list:
    """``{"--flag": value}`` as command-line words, the package's one writer of them: ``True`` the flag alone,
    ``None`` nothing, ``False`` nothing or, with ``negate``, the flag's ``--no-`` form (a loss's switches have
    one); any other value as ``str()`` writes it, a float in the format ``floats`` when one is given.

    Commands that are run or recorded (study plans, a benchmark's cached runs) keep ``str()``, so that those
    already committed read the same (``0.0``, not ``0``); the words a message quotes back to a person (a
    checkpoint's loss flags when a resume is refused) use ``floats="g"`` (``1``, not ``1.0``)."""
    words: list = []
    for flag, value in options.items():
        if value is True:
            words.append(flag)
        elif value is False:
            words += ["--no-" + flag[2:]] if negate else []
        elif value is not None:
            words += [flag, format(value, floats) if floats and isinstance(value, float) else str(value)]
    return words
