"""A study's plan: one TOML file that declares, before anything runs, what is compared and how it is judged.

The keys are documented in docs/studies.md; every one is checked, and an unknown key or a bad value is one
`PlanError` line naming it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

try:  # Python 3.11+
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

RULES = ("beats", "reaches", "matches")
#: the scores `clip-dcl study score` writes (retrieval always; zero-shot where the data have a zero-shot set)
METRICS = tuple(
    [f"retrieval/{d}_R@{k}" for d in ("image_to_text", "text_to_image") for k in (1, 5, 10)]
    + ["retrieval/mean_R@1", "zeroshot/top1", "zeroshot/top5", "zeroshot/mean_per_class_recall"]
)
#: [train] keys (and the arms' overrides) -> their type; they map onto `clip_dcl.experiment.Budget`
#: and `clip_dcl.experiment.train_command`'s options
TRAIN_KEYS = {
    "model": str,
    "epochs": int,
    "batch_size": int,
    "lr": float,
    "wd": float,
    "warmup": int,
    "workers": int,
    "log_every_n_steps": int,
    "precision": str,
    "device": str,
    "validate": bool,
    "flags": list,
}
#: OpenCLIP's ``--precision`` values
PRECISIONS = ("fp32", "amp", "amp_bf16", "fp16", "bf16", "pure_bf16", "pure_fp16", "amp_bfloat16")
#: what a plan of a registered recipe may set (the recipe sets the rest)
RECIPE_TRAIN_KEYS = ("epochs", "batch_size", "device", "flags")
DATA_KEYS = (
    "command",
    "train",
    "train_samples",
    "validation",
    "validation_samples",
    "validation_zeroshot",
    "test",
    "test_samples",
    "test_zeroshot",
)
TOP_KEYS = (
    "title",
    "recipe",
    "exploratory",
    "seeds",
    "metric",
    "confidence",
    "resolution",
    "power",
    "paired_sd",
    "spread_from",
    "looks",
    "alpha_split",
    "threads",
    "pair_across",
    "data",
    "train",
    "arms",
    "comparisons",
)
ARM_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+=-]*")  # used with fullmatch: `$` would pass a final newline
#: characters no plan string may hold: a run is one physical line of `study commands` (Slurm and GNU parallel
#: read it line by line), so a newline or carriage return inside a value would split it and run the rest
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
#: the training flags a study sets itself, each with the plan's own setting for it: an arm's or [train]'s flag
#: would come after the study's on the command line and win (a run trained outside its folder never finishes)
STUDY_FLAGS = {
    **dict.fromkeys(("--logs", "--name"), "the run's folder, WORK/runs/<arm>/seed<N>"),
    "--resume": "every line's --resume latest (a stopped run continues)",
    "--seed": "the plan's seeds",
    **{f"--{flag}": f"[data] {key}" for flag, key in (("train-data", "train"), ("val-data", "validation"))},
    **{f"--{flag}-num-samples": f"[data] {key}_samples" for flag, key in (("train", "train"), ("val", "validation"))},
    **dict.fromkeys(("--dataset-type", "--dataset-resampled"), "[data] (shards, every sample once an epoch)"),
    **{"--" + key.replace("_", "-"): f"[train] {key}" for key in TRAIN_KEYS if key not in ("validate", "flags")},
    "--val-frequency": "[train] validate",
    **dict.fromkeys(("--save-frequency", "--delete-previous-checkpoint"), "a checkpoint every epoch, the last kept"),
}
#: the `clip-dcl data` writers a [data] command may run (each writes a folder with a summary.json)
DATA_WRITERS = ("synth", "fashion-mnist", "fashion-scenes", "shards")


def check_flags(flags: Sequence[str], source: str, where: str) -> None:
    """Refuse (`PlanError`) a flag the study sets itself (`STUDY_FLAGS`), naming the plan's setting for it."""
    for word in flags:
        flag = word.split("=", 1)[0]
        if flag in STUDY_FLAGS:
            setting = STUDY_FLAGS[flag]
            raise PlanError(f"{source}: {where} = [... {word!r} ...]: the study sets {flag} itself (from {setting})")


def check_data_command(words: Sequence[str], source: str) -> None:
    """Refuse (`PlanError`) a [data] command that is not one of `DATA_WRITERS` or writes outside ``{DATA}``."""
    import contextlib
    import io
    import posixpath

    from ...data.cli import build_parser

    def fail(problem: str):
        raise PlanError(f"{source}: data.command = {list(words)!r}: {problem}")

    if len(words) < 2 or words[0] != "data" or words[1] not in DATA_WRITERS:
        fail(f"not a data writer; the command is the words after clip-dcl: data {' | '.join(DATA_WRITERS)} ...")
    root = "/{DATA}"  # a stand-in folder: where the output lands is a matter of the words alone
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said), contextlib.redirect_stdout(io.StringIO()):
            args = build_parser().parse_args([w.replace("{DATA}", root) for w in words[1:]])
    except SystemExit:
        lines = [x for x in said.getvalue().splitlines() if x.strip()]
        fail(lines[-1].split(": error: ", 1)[-1] if lines else "refused by clip-dcl data")
    out = posixpath.normpath(args.out_dir)
    if out != root and not out.startswith(root + "/"):
        fail(f"its output {args.out_dir.replace(root, '{DATA}')!r} is not {{DATA}} or a folder inside it")


def check_no_control(doc, source: str, where: str = "") -> None:
    """Refuse (`PlanError`, naming the field) a control character in any key or string of the parsed plan."""
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    for key, value in items:
        field_name = f"{where}[{key}]" if isinstance(key, int) else f"{where}.{key}" if where else str(key)
        if isinstance(key, str) and CONTROL.search(key):
            raise PlanError(f"{source}: key {key!r}: a control character in a key; write it on one line")
        if isinstance(value, str) and CONTROL.search(value):
            raise PlanError(
                f"{source}: {field_name} = {value!r}: holds a control character "
                f"({CONTROL.search(value).group()!r}); a plan's values must be plain one-line text"
            )
        check_no_control(value, source, field_name)


def registered_recipe(name: str):
    """The recipe called ``name`` (`clip_dcl.experiment.recipes`), or None for a name of one's own."""
    from ..recipes import RECIPES

    return RECIPES.get(name)


class PlanError(ValueError):
    """A plan that cannot run: the message is one line naming the file, the key and the bad value."""


@dataclass(frozen=True)
class Arm:
    """One arm: its name (a folder name too), its training flags, and [train] keys it overrides."""

    name: str
    flags: Tuple[str, ...] = ()
    overrides: Tuple[Tuple[str, Any], ...] = ()


@dataclass(frozen=True)
class Comparison:
    """``a - b`` paired by seed, judged by ``rule`` (beats | reaches | matches)."""

    a: str
    b: str
    rule: str
    margin: Optional[float] = None
    #: (from arm, to arm, share): the margin is ``share`` times the mean paired gain ``to - from``
    margin_gain: Optional[Tuple[str, str, float]] = None
    expected: Optional[float] = None
    paired_sd: Optional[float] = None
    #: judged on the plan's first this many seeds (None: all of them); its arms train at least these
    seeds: Optional[int] = None

    @property
    def label(self) -> str:
        return f"{self.a} {self.rule} {self.b}"


@dataclass(frozen=True)
class Plan:
    """A parsed, checked plan (`load_plan`). ``text`` is the file as written, ``source`` its path."""

    seeds: Tuple[int, ...]
    metric: str
    confidence: float
    resolution: float
    data: Dict[str, Any]
    train: Dict[str, Any]
    arms: Tuple[Arm, ...]
    comparisons: Tuple[Comparison, ...]
    recipe: str = "custom"
    title: str = ""
    power: float = 0.8
    paired_sd: Optional[float] = None
    spread_from: Optional[str] = None
    looks: Tuple[int, ...] = ()
    alpha_split: Tuple[float, ...] = ()
    threads: Optional[int] = None
    pair_across: Tuple[str, ...] = ()
    exploratory: bool = False
    text: str = field(default="", compare=False)
    source: str = field(default="", compare=False)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()

    def arm(self, name: str) -> Arm:
        return next(a for a in self.arms if a.name == name)

    def comparison_seeds(self, c: Comparison) -> Tuple[int, ...]:
        """The seeds ``c`` is judged on: the plan's first ``c.seeds`` (all of them when not given)."""
        return self.seeds if c.seeds is None else self.seeds[: c.seeds]

    def arm_seeds(self, name: str) -> Tuple[int, ...]:
        """The seeds arm ``name`` trains: as many as its comparisons read, all of them for an arm none names."""
        counts = [
            len(self.comparison_seeds(c))
            for c in self.comparisons
            if name in (c.a, c.b) or (c.margin_gain is not None and name in c.margin_gain[:2])
        ]
        return self.seeds[: max(counts)] if counts else self.seeds

    def pick_seeds(self, values: Sequence[str]) -> Tuple[int, ...]:
        """The plan's seeds named by ``values`` (seeds and ranges ``A-B``), in the plan's order."""
        picked = set()
        for value in values:
            for part in str(value).split(","):
                part = part.strip()
                m = re.fullmatch(r"(-?\d+)(?:-(-?\d+))?", part)
                if not m:
                    raise PlanError(f"--seeds {part!r}: not a seed or a range A-B")
                low, high = int(m.group(1)), int(m.group(2) if m.group(2) is not None else m.group(1))
                chosen = [s for s in self.seeds if low <= s <= high]
                if not chosen or (m.group(2) is None and low not in self.seeds):
                    raise PlanError(f"--seeds {part!r}: not among the plan's seeds ({self.seeds[0]}..{self.seeds[-1]})")
                picked.update(chosen)
        return tuple(s for s in self.seeds if s in picked)

    def runs(self) -> List[Tuple[str, int]]:
        """Every ``(arm, seed)`` the plan trains, seed after seed (the arms of the first seed first)."""
        per_arm = {arm.name: set(self.arm_seeds(arm.name)) for arm in self.arms}
        return [(arm.name, seed) for seed in self.seeds for arm in self.arms if seed in per_arm[arm.name]]

    @property
    def split(self) -> str:
        """The split the comparisons are judged on: test, or validation when exploratory."""
        return "validation" if self.exploratory else "test"

    def design(self) -> List[Tuple[int, float]]:
        """The looks as ``(seeds, alpha)``: one look at every seed at ``1 - confidence`` unless declared."""
        if not self.looks:
            return [(len(self.seeds), 1 - self.confidence)]
        return list(zip(self.looks, self.alpha_split))

    def design_text(self) -> str:
        """The design in words, as the report states it."""
        looks = self.design()
        if len(looks) == 1:
            if any(c.seeds is not None for c in self.comparisons):
                return (
                    f"one look, when every planned run has its scores (each comparison on its own number of the "
                    f"{len(self.seeds)} seeds); {100 * self.confidence:.0f} % t-intervals"
                )
            return f"one look, when all {len(self.seeds)} seeds have run; {100 * self.confidence:.0f} % t-intervals"
        return (
            f"sequential: {len(looks)} looks, at "
            + ", ".join(str(n) for n, _ in looks)
            + " seeds, the error "
            + f"{1 - self.confidence:.3g} spent over them as "
            + ", ".join(f"{a:.3g}" for _, a in looks)
            + " (each look's interval at 1 minus its share; a comparison stops at its first verdict)"
        )

    def canonical(self) -> Dict[str, Any]:
        """The plan as plain data (what `plan_changes` compares)."""
        out = dataclasses.asdict(self)
        out.pop("text"), out.pop("source")
        out["arms"] = [{"name": a.name, "flags": list(a.flags), **dict(a.overrides)} for a in self.arms]
        for c in out["comparisons"]:  # a plan without per-comparison seeds keeps the form sealed before they existed
            if c.get("seeds") is None:
                c.pop("seeds", None)
        return _plain(out)


def _plain(x):
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x


def load_plan(path) -> Plan:
    """Read and check the plan file ``path`` (`PlanError` on any problem)."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise PlanError(f"{path}: cannot read the plan ({e.strerror})") from None
    return parse_plan(text, str(path))


def parse_plan(text: str, source: str = "plan") -> Plan:
    """Parse and check a plan's TOML ``text`` (``source`` names it in errors)."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise PlanError(f"{source}: not valid TOML: {e}") from None
    check_no_control(doc, source)
    c = _Checker(source)
    c.keys(doc, TOP_KEYS, "")
    recipe = c.typed(doc.get("recipe", "custom"), str, "recipe")
    registered = registered_recipe(recipe)
    for key in ("seeds", "metric", "confidence", "resolution", "data", "train", "arms", "comparisons"):
        if key not in doc and not (registered and key in ("data", "train")):
            raise PlanError(f"{source}: missing key {key!r}")
    seeds = c.int_list(doc["seeds"], "seeds", minimum=0)
    if not seeds or len(set(seeds)) != len(seeds):
        raise PlanError(f"{source}: seeds = {seeds!r}: give one or more distinct seeds")
    metric = c.typed(doc["metric"], str, "metric")
    if metric not in METRICS:
        raise PlanError(f"{source}: metric = {metric!r}: choose one of {', '.join(METRICS)}")
    confidence = c.fraction(doc["confidence"], "confidence")
    resolution = c.number(doc["resolution"], "resolution", minimum=0.0)
    data = _data(c, doc["data"] if "data" in doc else {"command": list(registered.data_argv)})
    allowed = RECIPE_TRAIN_KEYS if registered else TRAIN_KEYS
    train = _train(c, doc.get("train", {}), "train", allowed)
    arms = _arms(c, doc["arms"], allowed)
    names = [a.name for a in arms]
    comparisons = tuple(
        _comparison(c, x, f"comparisons[{i}]", names, len(seeds))
        for i, x in enumerate(c.tables(doc["comparisons"], "comparisons"))
    )
    if not comparisons:
        raise PlanError(f"{source}: comparisons: declare at least one [[comparisons]]")
    power = c.fraction(doc.get("power", 0.8), "power")
    paired_sd = c.number(doc["paired_sd"], "paired_sd", minimum=0.0, strict=True) if "paired_sd" in doc else None
    spread_from = c.typed(doc["spread_from"], str, "spread_from") if "spread_from" in doc else None
    looks, alpha = _looks(c, doc, len(seeds), confidence)
    per_comparison = next((i for i, x in enumerate(comparisons) if x.seeds is not None), None)
    if looks and per_comparison is not None:
        raise PlanError(
            f"{source}: comparisons[{per_comparison}].seeds: a sequential plan (looks) judges every "
            "comparison on the seeds of each look; give seeds per comparison in a one-look plan only"
        )
    threads = c.int_value(doc["threads"], "threads", minimum=1) if "threads" in doc else None
    pair_across = tuple(c.str_list(doc.get("pair_across", []), "pair_across"))
    for value in pair_across:
        if value not in ("machines", "recipes"):
            raise PlanError(f"{source}: pair_across = {list(pair_across)!r}: the values are 'machines' and 'recipes'")
    if (
        metric.startswith("zeroshot/")
        and not data.get("from_summary")
        and not (data.get("validation_zeroshot") and data.get("test_zeroshot"))
    ):
        raise PlanError(f"{source}: metric = {metric!r} needs [data] validation_zeroshot and test_zeroshot")
    return Plan(
        seeds=tuple(seeds),
        metric=metric,
        confidence=confidence,
        resolution=resolution,
        data=data,
        train=train,
        arms=arms,
        comparisons=comparisons,
        recipe=recipe,
        title=c.typed(doc.get("title", ""), str, "title"),
        exploratory=c.typed(doc.get("exploratory", False), bool, "exploratory"),
        power=power,
        paired_sd=paired_sd,
        spread_from=spread_from,
        looks=looks,
        alpha_split=alpha,
        threads=threads,
        pair_across=pair_across,
        text=text,
        source=source,
    )


class _Checker:
    """Type and range checks whose errors name the plan, the key and the value."""

    def __init__(self, source: str):
        self.source = source

    def fail(self, key: str, value, problem: str):
        raise PlanError(f"{self.source}: {key} = {value!r}: {problem}")

    def keys(self, table: dict, allowed, where: str):
        for key in table:
            if key not in allowed:
                place = f"[{where}]" if where else "the top level"
                raise PlanError(f"{self.source}: unknown key {key!r} in {place}; expected one of {', '.join(allowed)}")

    def typed(self, value, kind, key: str):
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kind) or (kind in (int, float) and isinstance(value, bool)):
            self.fail(key, value, f"expected {'a number' if kind is float else kind.__name__}")
        return value

    def number(self, value, key: str, minimum: Optional[float] = None, strict: bool = False) -> float:
        value = self.typed(value, float, key)
        if not math.isfinite(value) or (minimum is not None and (value <= minimum if strict else value < minimum)):
            self.fail(key, value, f"expected a number {'>' if strict else '>='} {minimum}")
        return value

    def fraction(self, value, key: str) -> float:
        value = self.typed(value, float, key)
        if not 0 < value < 1:
            self.fail(key, value, "expected a number between 0 and 1")
        return value

    def int_value(self, value, key: str, minimum: int = 0) -> int:
        value = self.typed(value, int, key)
        if value < minimum:
            self.fail(key, value, f"expected an integer >= {minimum}")
        return value

    def int_list(self, value, key: str, minimum: int = 0) -> List[int]:
        if not isinstance(value, list):
            self.fail(key, value, "expected a list of integers")
        return [self.int_value(v, key, minimum) for v in value]

    def str_list(self, value, key: str) -> List[str]:
        if isinstance(value, str):  # a command written as one string; a backslash is part of a path, no escape
            words = shlex.shlex(value, posix=True)
            words.whitespace_split, words.escape, words.commenters = True, "", ""
            return list(words)
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            self.fail(key, value, "expected a list of strings")
        return list(value)

    def tables(self, value, key: str) -> List[dict]:
        if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
            self.fail(key, value, f"expected [[{key}]] tables")
        return value


def _data(c: _Checker, table) -> Dict[str, Any]:
    if not isinstance(table, dict):
        c.fail("data", table, "expected a [data] table")
    c.keys(table, DATA_KEYS, "data")
    out: Dict[str, Any] = {}
    for key in DATA_KEYS:
        if key not in table:
            continue
        if key == "command":
            out[key] = c.str_list(table[key], "data.command")
            if not any("{DATA}" in w for w in out[key]):
                c.fail("data.command", table[key], "the command must write into {DATA} (the study's data folder)")
            check_data_command(out[key], c.source)
        elif key.endswith("_samples"):
            out[key] = c.int_value(table[key], f"data.{key}", minimum=1)
        else:
            out[key] = c.typed(table[key], str, f"data.{key}")
    given = [k for k in ("train", "validation", "test") if k in out]
    if "command" in out and not given:
        out["from_summary"] = True  # the synthetic layout's summary.json names the splits
    elif len(given) < 3:
        missing = [k for k in ("train", "validation", "test") if k not in out]
        raise PlanError(
            f"{c.source}: [data] lacks {', '.join(missing)}: give train, validation and test (shards), "
            "or a command whose output's summary.json names them"
        )
    if "command" not in out:
        for key, value in out.items():
            if "{DATA}" in str(value):
                c.fail(f"data.{key}", value, "{DATA} is the folder a [data] command writes, and there is no command")
    return out


def _train(c: _Checker, table, where: str, allowed=TRAIN_KEYS) -> Dict[str, Any]:
    if not isinstance(table, dict):
        c.fail(where, table, f"expected a [{where}] table")
    c.keys(table, tuple(allowed), where)
    out: Dict[str, Any] = {}
    for key, value in table.items():
        kind = TRAIN_KEYS[key]
        if kind is list:
            out[key] = c.str_list(value, f"{where}.{key}")
            check_flags(out[key], c.source, f"{where}.{key}")
        elif kind is int:
            out[key] = c.int_value(value, f"{where}.{key}", minimum=0 if key in ("warmup", "workers") else 1)
        elif kind is float:
            out[key] = c.number(value, f"{where}.{key}", minimum=0.0, strict=key == "lr")
        else:
            out[key] = c.typed(value, kind, f"{where}.{key}")
    if "precision" in out and out["precision"] not in PRECISIONS:
        c.fail(f"{where}.precision", out["precision"], "not one of OpenCLIP's precisions")
    return out


def _arms(c: _Checker, value, allowed=TRAIN_KEYS) -> Tuple[Arm, ...]:
    arms = []
    for i, table in enumerate(c.tables(value, "arms")):
        where = f"arms[{i}]"
        if "name" not in table:
            raise PlanError(f"{c.source}: {where} has no name")
        name = c.typed(table["name"], str, f"{where}.name")
        if not ARM_NAME.fullmatch(name):
            c.fail(f"{where}.name", name, "use letters, digits and _ . + = - (it names the arm's folder)")
        rest = {k: v for k, v in table.items() if k != "name"}
        settings = _train(c, rest, where, allowed=("flags", *(k for k in allowed if k != "flags")))
        flags = tuple(settings.pop("flags", ()))
        arms.append(Arm(name, flags, tuple(sorted(settings.items()))))
    names = [a.name for a in arms]
    if len(arms) < 2:
        raise PlanError(f"{c.source}: arms: declare two or more [[arms]]")
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup:
        c.fail("arms.name", dup, "two arms have this name")
    return tuple(arms)


def _comparison(c: _Checker, table: dict, where: str, names: List[str], n_seeds: int) -> Comparison:
    c.keys(table, ("a", "b", "rule", "margin", "margin_gain", "expected", "paired_sd", "seeds"), where)
    for key in ("a", "b", "rule"):
        if key not in table:
            raise PlanError(f"{c.source}: {where} lacks {key!r}")
    a, b = c.typed(table["a"], str, f"{where}.a"), c.typed(table["b"], str, f"{where}.b")
    for key, arm in (("a", a), ("b", b)):
        if arm not in names:
            c.fail(f"{where}.{key}", arm, f"no such arm; the arms are {', '.join(names)}")
    if a == b:
        c.fail(f"{where}.b", b, "an arm compared with itself")
    rule = c.typed(table["rule"], str, f"{where}.rule")
    if rule not in RULES:
        c.fail(f"{where}.rule", rule, f"choose {', '.join(RULES)}")
    margin = c.number(table["margin"], f"{where}.margin", minimum=0.0, strict=True) if "margin" in table else None
    gain = None
    if "margin_gain" in table:
        g = table["margin_gain"]
        if not isinstance(g, dict) or set(g) != {"from", "to", "share"}:
            c.fail(f"{where}.margin_gain", g, "expected {from = ARM, to = ARM, share = NUMBER}")
        for key in ("from", "to"):
            if g[key] not in names:
                c.fail(f"{where}.margin_gain.{key}", g[key], f"no such arm; the arms are {', '.join(names)}")
        gain = (g["from"], g["to"], c.number(g["share"], f"{where}.margin_gain.share", minimum=0.0, strict=True))
    if rule == "beats" and (margin is not None or gain is not None):
        c.fail(
            f"{where}.margin",
            table.get("margin", table.get("margin_gain")),
            "'beats' has no margin (its bar is zero and the resolution)",
        )
    if rule != "beats" and (margin is None) == (gain is None):
        raise PlanError(f"{c.source}: {where}: rule {rule!r} needs exactly one of margin and margin_gain")
    expected = c.typed(table["expected"], float, f"{where}.expected") if "expected" in table else None
    sd = c.number(table["paired_sd"], f"{where}.paired_sd", minimum=0.0, strict=True) if "paired_sd" in table else None
    n = None
    if "seeds" in table:
        n = table["seeds"]
        if isinstance(n, bool) or not isinstance(n, int) or not 2 <= n <= n_seeds:
            c.fail(f"{where}.seeds", n, f"expected a number of seeds from 2 to the plan's {n_seeds} (its first ones)")
    return Comparison(a, b, rule, margin, gain, expected, sd, n)


def _looks(c: _Checker, doc: dict, n_seeds: int, confidence: float):
    if "looks" not in doc:
        if "alpha_split" in doc:
            c.fail("alpha_split", doc["alpha_split"], "an error split without looks; declare looks = [...]")
        return (), ()
    looks = c.int_list(doc["looks"], "looks", minimum=2)
    if not looks or looks != sorted(set(looks)) or looks[-1] != n_seeds:
        c.fail("looks", looks, f"expected increasing seed counts ending at the plan's {n_seeds} seeds")
    if "alpha_split" not in doc:
        raise PlanError(
            f"{c.source}: looks = {looks!r} needs alpha_split: the error {1 - confidence:.3g} spent over "
            'the looks (a list, or "bonferroni" for equal shares)'
        )
    split = doc["alpha_split"]
    total = 1 - confidence
    if split == "bonferroni":
        alpha = [total / len(looks)] * len(looks)
    else:
        if not isinstance(split, list) or len(split) != len(looks):
            c.fail("alpha_split", split, f'expected {len(looks)} numbers (one a look) or "bonferroni"')
        alpha = [c.fraction(v, "alpha_split") for v in split]
        if sum(alpha) > total + 1e-9:
            c.fail(
                "alpha_split",
                split,
                f"spends {sum(alpha):.4g}, more than the plan's error 1 - confidence = {total:.4g}",
            )
    return tuple(looks), tuple(alpha)
