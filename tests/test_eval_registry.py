"""The evaluation task registry: a task added by one file and one registration line runs through
``clip-dcl eval`` and its report; re-registration warns; the evaluation modules import no cycle."""

from __future__ import annotations

import ast
import importlib
import json
import sys
from pathlib import Path

import pytest
import torch

from clip_dcl.eval import registry

PACKAGE = Path(__file__).resolve().parents[1] / "clip_dcl"

# The whole of a new task: this file, plus the import of its module (its registration line runs there).
TOY_TASK = """
import torch

from clip_dcl.eval.registry import EvalTask, TaskResult, register_task
from clip_dcl.eval.report import metrics_table


def add_arguments(parser):
    parser.add_argument("--data", required=True, help="a text file, one caption a line")


@torch.no_grad()
def run(model, preprocess, tokenizer, args, common):
    captions = [c for c in open(args.data).read().splitlines() if c.strip()]
    norms = model.encode_text(tokenizer(captions)).norm(dim=-1)
    return TaskResult({"mean_text_norm": norms.mean().item()}, {"path": args.data, "num_texts": len(captions)})


register_task(EvalTask(name="textnorm", help="mean norm of the text features", description="A toy task.",
                       add_arguments=add_arguments, run=run, metrics=("mean_text_norm",),
                       table=lambda metrics, args: metrics_table(metrics), benchmark_name="text_norm",
                       benchmark_metrics=lambda m: {"norm": m["mean_text_norm"]}))
"""


@pytest.fixture
def toy_task(tmp_path, monkeypatch):
    """The toy task's module written and imported; the registry restored afterwards."""
    import clip_dcl.eval.tasks  # noqa: F401  (the built-in tasks first)

    monkeypatch.setattr(registry, "_TASKS", dict(registry._TASKS))
    (tmp_path / "toy_eval_task.py").write_text(TOY_TASK)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("toy_eval_task", None)
    importlib.import_module("toy_eval_task")
    yield registry.get_task("textnorm")
    sys.modules.pop("toy_eval_task", None)


def test_a_new_task_runs_through_the_cli_and_the_report(toy_task, tmp_path, capsys):
    import open_clip

    from clip_dcl.checkpoint import load_checkpoint
    from clip_dcl.eval.cli import build_parser, main
    from clip_dcl.models import TINY_MODEL

    assert "textnorm" in build_parser().format_help()
    torch.manual_seed(0)
    ckpt = tmp_path / "ckpt.pt"
    torch.save({"state_dict": open_clip.create_model(TINY_MODEL).state_dict(), "clip_dcl": {"model": TINY_MODEL}}, ckpt)
    captions = tmp_path / "captions.txt"
    captions.write_text("a red square\ntwo blue circles\n")
    out = tmp_path / "r" / "ours.json"
    assert (
        main(
            [
                "textnorm",
                "--checkpoint",
                str(ckpt),
                "--data",
                str(captions),
                "--output",
                str(out),
                "--format",
                "clip_benchmark",
                "--dataset-name",
                "toy",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    doc = json.loads(out.read_text())
    model, _, tokenizer = load_checkpoint(ckpt)
    with torch.no_grad():
        expected = model.encode_text(tokenizer(["a red square", "two blue circles"])).norm(dim=-1).mean().item()
    assert doc["mean_text_norm"] == expected and f"{expected:.4f}" in printed
    assert doc["data"] == {"path": str(captions), "num_texts": 2}
    assert doc["settings"]["batch_size"] == 64 and doc["model"]["checkpoint"] == str(ckpt)
    bench = json.loads((out.parent / f"toy_ckpt.pt_{TINY_MODEL}_en_text_norm.json").read_text())
    assert bench["task"] == "text_norm" and bench["metrics"] == {"norm": expected}
    # the checks of the shared flags apply to it too
    assert main(["textnorm", "--model", TINY_MODEL, "--data", str(captions), "--batch-size", "0"]) == 2
    assert "clip-dcl eval: --batch-size must be >= 1, got 0" in capsys.readouterr().err


def test_registering_a_name_again_warns_and_replaces(toy_task):
    again = registry.EvalTask(name="textnorm", help="h", description="d", run=toy_task.run)
    with pytest.warns(UserWarning, match="'textnorm' is registered again"):
        registry.register_task(again)
    assert registry.get_task("textnorm") is again
    with pytest.raises(KeyError, match="no evaluation task 'nope'; registered: retrieval, zeroshot, fewshot"):
        registry.get_task("nope")
    with pytest.raises(ValueError, match="names CLIP_benchmark's 'x' but declares neither"):
        registry.EvalTask(name="y", help="h", description="d", run=toy_task.run, benchmark_name="x")


def test_each_built_in_task_declares_its_options_metrics_table_and_clip_benchmark_name():
    from clip_dcl.eval.tasks import registered_tasks

    tasks = registered_tasks()
    assert {n: t.benchmark_name for n, t in tasks.items() if n in ("retrieval", "zeroshot", "fewshot")} == {
        "retrieval": "zeroshot_retrieval",
        "zeroshot": "zeroshot_classification",
        "fewshot": "linear_probe",
    }
    for task in tasks.values():
        assert task.metrics and task.table is not None and task.benchmark_run is not None


def _imports(path: Path, module: str) -> set[str]:
    """The clip_dcl modules ``path`` imports, at the top level or inside functions."""
    is_pkg = path.name == "__init__.py"
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = module if is_pkg else module.rsplit(".", 1)[0]
            for _ in range(node.level - 1):
                base = base.rsplit(".", 1)[0]
            target = (f"{base}.{node.module}" if node.module else base) if node.level else node.module
            found.add(target)
            found.update(f"{target}.{a.name}" for a in node.names)
    return {m for m in found if m.startswith("clip_dcl")}


def test_no_import_cycle_in_the_package():
    modules = {}
    for f in PACKAGE.rglob("*.py"):
        parts = f.relative_to(PACKAGE.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    graph = {}
    for name, f in modules.items():
        deps = set()
        for target in _imports(f, name):
            while target not in modules and "." in target:
                target = target.rsplit(".", 1)[0]
            # a module's own parent packages are imported before it whatever it says: no edge
            if target in modules and target != name and not name.startswith(target + "."):
                deps.add(target)
        graph[name] = deps

    def reaches(start, goal, seen):
        for d in graph[start]:
            if d == goal or (d not in seen and not seen.add(d) and reaches(d, goal, seen)):
                return True
        return False

    cycles = sorted(name for name in graph if reaches(name, name, set()))
    assert cycles == []
    assert "clip_dcl.eval.benchmark" in graph["clip_dcl.eval.cli"]  # the graph is read, not empty


def test_the_shipped_tasks_are_listed_in_one_order_whichever_module_registered_first(monkeypatch):
    from clip_dcl.eval import tasks  # noqa: F401  (every shipped task registered)

    shipped = {name: registry.get_task(name) for name in registry.BUILTIN_ORDER}
    # as a process that imported clip_dcl.eval.zeroshot before the others would have them
    monkeypatch.setattr(
        registry,
        "_TASKS",
        {
            "zeroshot": shipped["zeroshot"],
            "mine": shipped["fewshot"],
            "fewshot": shipped["fewshot"],
            "retrieval": shipped["retrieval"],
        },
    )
    assert list(registry.registered_tasks()) == ["retrieval", "zeroshot", "fewshot", "mine"]
    with pytest.raises(KeyError, match="registered: retrieval, zeroshot, fewshot, mine"):
        registry.get_task("nope")
