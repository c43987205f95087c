"""The argument parser of the ``clip-dcl`` commands: flags spelled out in full, and an unknown flag refused
with the flags closest to it (``--batchsize`` -> ``--batch-size``) before any work."""

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


def _subcommand(parser: argparse.ArgumentParser) -> Optional[argparse.Action]:
    return next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)


class FlagParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` without abbreviations whose ``parse_args`` names the closest flags of the
    (sub)command for a misspelt one, in one line, exit 2; subcommands' parsers are of this class too."""

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
