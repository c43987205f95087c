"""The ``clip-dcl`` command: ``clip-dcl data|train|eval|export|demo|study ...``, each a function of the
remaining words, imported only when its command runs (so that ``clip-dcl --help`` stays fast).
"""

from __future__ import annotations

import importlib
import sys

#: subcommand -> ("module:function", one-line help). The function takes ``argv`` and returns an exit code.
COMMANDS = {
    "data": (
        "clip_dcl.data.cli:main",
        "make or convert data sets: synth | fashion-mnist | fashion-scenes | shards (your own images and "
        "captions) | pack | benchmark (CLIP_benchmark's layout)",
    ),
    "train": (
        "clip_dcl.train:command_main",
        "train with OpenCLIP's loop and a registered objective (clip, dcl, decl, curl)",
    ),
    "eval": ("clip_dcl.eval.cli:main", "evaluate a checkpoint: retrieval | zeroshot | fewshot | benchmark"),
    "export": ("clip_dcl.checkpoint:export_main", "export a checkpoint to OpenCLIP's local-dir layout"),
    "demo": ("clip_dcl.demo:main", "the whole job on synthetic data: data, training, evaluation, table"),
    "study": (
        "clip_dcl.experiment.study.cli:main",
        "a comparison declared in a plan file: check | commands | run | report",
    ),
}


def _usage() -> str:
    lines = ["usage: clip-dcl COMMAND [ARGS...]", "", "commands:"]
    width = max(len(c) for c in COMMANDS)
    for name, (_, text) in COMMANDS.items():
        lines.append(f"  {name.ljust(width)}  {text}")
    lines.append("")
    lines.append("Run `clip-dcl COMMAND --help` for the flags of one command.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        from .arguments import not_one_of

        print(f"clip-dcl: error: {not_one_of(name, list(COMMANDS), 'a command')}", file=sys.stderr)
        return 2
    target, _ = COMMANDS[name]
    module_name, func_name = target.split(":")
    func = getattr(importlib.import_module(module_name), func_name)
    result = func(rest)
    return int(result or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
