"""Load any checkpoint our training writes, and export it to OpenCLIP's ``local-dir`` layout.

The model is found without the training flags: the ``model`` argument, the checkpoint's
``clip_dcl`` entry, or OpenCLIP's ``params.txt``; a config found is registered with OpenCLIP first.
An export loads with ``open_clip.create_model_and_transforms("local-dir:OUT_DIR")``, without clip-dcl.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path

from . import exitcodes
from .arguments import FlagParser
from .paths import current_umask, write_json
from .train import saving
from .train.saving import CheckpointUnreadable, UnsafeCheckpoint

__all__ = [
    "load_checkpoint",
    "export",
    "export_main",
    "resolve_model",
    "read_params",
    "register_config_dict",
    "CheckpointUnreadable",
    "UnsafeCheckpoint",
    "CONFIG_NAME",
    "WEIGHTS_NAME",
]

log = logging.getLogger(__name__)

CONFIG_NAME = "open_clip_config.json"
WEIGHTS_NAME = "open_clip_model.safetensors"


def read_params(ckpt_path: str | os.PathLike) -> dict[str, str]:
    """The ``model`` and ``model_config`` lines of OpenCLIP's ``params.txt`` (two folders up, then beside)."""
    here = Path(ckpt_path).absolute().parent
    for params in (here.parent / "params.txt", here / "params.txt"):
        if params.is_file():
            break
    else:
        return {}
    out = {}
    for line in params.read_text(encoding="utf-8").splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("model", "model_config") and value.strip() not in ("", "None"):
            out[key.strip()] = value.strip()
    return out


def register_config_dict(name: str, config: dict) -> str:
    """Register a model config dict with OpenCLIP under ``name`` (written to a cache JSON)."""
    from .models import register_model_config

    if not isinstance(config, dict):
        raise ValueError(f"model config for {name!r} must be a dict, got {type(config).__name__}")
    text = json.dumps(config, sort_keys=True)
    digest = hashlib.sha1(text.encode()).hexdigest()[:12]
    # One folder per distinct config, so that two configs with the same name never overwrite
    # each other's file; OpenCLIP names the model after the file stem.
    folder = Path(tempfile.gettempdir()) / "clip_dcl_model_configs" / digest
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    if not path.is_file() or path.read_text() != text:
        tmp = folder / f".{name}.{os.getpid()}.tmp"
        tmp.write_text(text)
        os.replace(tmp, path)
    register_model_config(path)
    return name


#: ``preprocess_cfg`` keys of a checkpoint's entry -> ``create_model_and_transforms`` arguments
#: (the ``--image-*`` flags OpenCLIP's trainer applies; the size follows the model config).
_PREPROCESS_ARGS = {
    "mean": "image_mean",
    "std": "image_std",
    "interpolation": "image_interpolation",
    "resize_mode": "image_resize_mode",
}


def _create_empty(name: str, preprocess_cfg: dict | None = None):
    import open_clip

    kwargs = {
        arg: preprocess_cfg[key]
        for key, arg in _PREPROCESS_ARGS.items()
        if preprocess_cfg and preprocess_cfg.get(key) is not None
    }

    def quiet(record: logging.LogRecord) -> bool:  # OpenCLIP's "initialized randomly": our weights come next
        return "No pretrained weights loaded" not in record.getMessage()

    root = logging.getLogger()
    root.addFilter(quiet)
    try:
        net, _, preprocess = open_clip.create_model_and_transforms(name, pretrained=None, **kwargs)
    finally:
        root.removeFilter(quiet)
    return net, preprocess


def resolve_model(
    path: str | os.PathLike, ckpt: dict, model: str | None = None, model_config: str | os.PathLike | dict | None = None
) -> str:
    """The model name for a loaded checkpoint dict, registering any custom config (module docstring)."""
    from .models import register_builtin_configs, register_model_config

    register_builtin_configs()
    entry = ckpt.get(saving.CKPT_KEY) if isinstance(ckpt, dict) else None
    if entry is not None and not isinstance(entry, dict):
        raise ValueError(
            f"checkpoint {str(path)!r}: {saving.CKPT_KEY!r} entry must be a dict, got {type(entry).__name__}"
        )
    entry = entry or {}
    if model_config is not None:
        if isinstance(model_config, dict):
            name = model or entry.get("model")
            if not name:
                raise ValueError("a model_config dict needs a model name (model=...)")
            return register_config_dict(name, model_config)
        registered = register_model_config(model_config)
        return model or registered
    params = {} if (model or entry.get("model")) else read_params(path)
    name = model or entry.get("model") or params.get("model")
    if not name:
        raise ValueError(
            f"checkpoint {str(path)!r} does not name its model (no {saving.CKPT_KEY!r} entry and no params.txt two "
            f"folders up or beside it); pass --model NAME (and --model-config PATH for a custom architecture), "
            f"or model='<name>' / model_config=... from Python"
        )
    if params.get("model_config") and entry.get("model_config") is None:
        config_path = Path(params["model_config"])
        if not config_path.exists():
            raise ValueError(
                f"checkpoint {str(path)!r}: its params.txt names --model-config {str(config_path)!r}, "
                "which does not exist; pass --model-config PATH"
            )
        register_model_config(config_path)
    if entry.get("model_config") is not None and (model is None or model == entry.get("model")):
        register_config_dict(name, entry["model_config"])
    return name


def _mismatch_summary(err: RuntimeError) -> str:
    """torch's ``load_state_dict`` error in one line: counts, and the first size mismatch."""
    import re

    text = str(err)
    sizes = re.findall(
        r"size mismatch for ([^:]+): copying a param with shape (torch\.Size\(\[[^\]]*\]\)) from "
        r"checkpoint, the shape in current model is (torch\.Size\(\[[^\]]*\]\))",
        text,
    )
    missing = re.search(r"Missing key\(s\) in state_dict: (.*?)\.\s*(?:Unexpected|size mismatch|$)", text, re.S)
    unexpected = re.search(r"Unexpected key\(s\) in state_dict: (.*?)\.\s*(?:Missing|size mismatch|$)", text, re.S)
    parts = []
    if sizes:
        k, theirs, ours = sizes[0]
        shape = lambda s: s.replace("torch.Size(", "").rstrip(")")  # noqa: E731
        parts.append(
            f"{len(sizes)} tensor(s) of another shape (e.g. {k}: {shape(theirs)} in the checkpoint, "
            f"{shape(ours)} in the model)"
        )
    for what, m in (("missing from the checkpoint", missing), ("not in the model", unexpected)):
        if m:
            keys = re.findall(r'"([^"]+)"', m.group(1))
            parts.append(f"{len(keys)} key(s) {what}" + (f" (e.g. {keys[0]})" if keys else ""))
    return "; ".join(parts) or text.strip().splitlines()[0]


def _mismatch_message(path, ckpt: dict, name: str, asked: str | None, model_config, err: RuntimeError) -> str:
    """Why the weights do not load into ``name``: the model the checkpoint was trained as, when it says."""
    entry = ckpt.get(saving.CKPT_KEY) if isinstance(ckpt.get(saving.CKPT_KEY), dict) else {}
    own, source = entry.get("model"), f"its {saving.CKPT_KEY!r} entry"
    if not own:
        own, source = read_params(path).get("model"), "the params.txt of its run"
    summary = _mismatch_summary(err)
    if own and own != name:
        flag = f"--model {asked}" if asked else f"--model-config {model_config}"
        return (
            f"checkpoint {str(path)!r} was trained as model {own!r} ({source}), not {name!r} as {flag} asks: "
            f"{summary}. Drop {flag.split()[0]} (the checkpoint names its model) or pass --model {own}"
        )
    if own:
        return (
            f"checkpoint {str(path)!r} was trained as model {own!r} ({source}) but does not fit its current "
            f"config ({summary}); was the config changed? Pass the config it was trained with "
            f"(--model-config)"
        )
    return (
        f"checkpoint {str(path)!r} does not fit model {name!r} ({summary}); it does not record the model it was "
        f"trained as: pass that one with --model (and --model-config for a custom architecture)"
    )


def _exported_without_local_dir(folder: Path):
    """``(model, preprocess_val, name)`` of an exported folder for an OpenCLIP without ``local-dir:``: its config
    registered under a name of its own, its weights (safetensors, else weights-only torch) loaded strictly."""
    doc = json.loads((folder / CONFIG_NAME).read_text())
    name = register_config_dict(
        f"clip-dcl-export-{hashlib.sha1(str(folder).encode()).hexdigest()[:8]}", doc["model_cfg"]
    )
    net, preprocess = _create_empty(name, doc.get("preprocess_cfg"))
    weights = sorted(p for p in folder.iterdir() if p.suffix in WEIGHT_ENDINGS and p.is_file())[0]
    if weights.suffix == ".safetensors":
        from safetensors.torch import load_file

        state = load_file(str(weights))
    else:
        state = saving.read_checkpoint(weights)
    net.load_state_dict(state.get("state_dict", state), strict=True)
    return net, preprocess, name


def load_checkpoint(
    path: str | os.PathLike,
    device: str = "cpu",
    model: str | None = None,
    model_config: str | os.PathLike | dict | None = None,
    allow_unsafe_pickle: bool = False,
):
    """Load a trained model for downstream use: ``(model in eval mode, OpenCLIP's preprocess_val, tokenizer)``.

    ``model``/``model_config`` say what the checkpoint does not; ``allow_unsafe_pickle`` permits full
    unpickling, which can run code, for trusted files. ``ValueError`` (also `CheckpointUnreadable` and
    `UnsafeCheckpoint`) when the file or its model cannot be read.
    """
    import open_clip

    path = Path(path)
    if path.is_dir():
        check_export(path, allow_unsafe_pickle)
        from .models import register_builtin_configs

        register_builtin_configs()
        recorded = exported_model_name(path, model)
        name = f"local-dir:{path}"
        try:
            if hasattr(open_clip.factory, "LOCAL_DIR_PREFIX"):
                net, _, preprocess = open_clip.create_model_and_transforms(name, device=device)
            else:  # an OpenCLIP before local-dir (2.32): the same config and weights, read here
                net, preprocess, name = _exported_without_local_dir(path)
                net = net.to(device)
        except (RuntimeError, KeyError, TypeError) as e:  # weights that do not fit the config
            raise ValueError(
                f"exported folder {str(path)!r} does not load: its weights do not fit its {CONFIG_NAME} "
                f"({str(e).splitlines()[0][:300]}); export it again"
            ) from None
        # what the evaluations record: the name OpenCLIP loads it by, and the model its config was exported from
        net.clip_dcl_model_name, net.clip_dcl_exported_model = name, recorded
        return net.eval(), preprocess, open_clip.get_tokenizer(name)
    if not path.is_file():
        raise ValueError(f"checkpoint {str(path)!r} does not exist")
    ckpt = saving.read_checkpoint(path, allow_unsafe_pickle)
    if not isinstance(ckpt, dict):
        raise ValueError(f"checkpoint {str(path)!r} holds a {type(ckpt).__name__}, not a dict")
    name = resolve_model(path, ckpt, model, model_config)
    from .models import model_name_problem

    problem = model_name_problem(name)
    if problem:
        raise ValueError(f"--model {problem}" if model else f"checkpoint {str(path)!r} names the model {problem}")
    state_dict = ckpt.get("state_dict", ckpt)
    state_dict = saving.model_keys_for(
        {k: v for k, v in state_dict.items() if k not in (saving.CKPT_KEY, saving.LOSS_STATE_KEY)}, wrapped=False
    )
    entry = ckpt.get(saving.CKPT_KEY) or {}
    # The eval transform the model was trained with (--image-mean/std/interpolation/resize-mode).
    net, preprocess = _create_empty(name, entry.get("preprocess_cfg"))
    try:
        net.load_state_dict(state_dict, strict=True)
    except RuntimeError as e:
        raise ValueError(_mismatch_message(path, ckpt, name, model, model_config, e)) from None
    net = net.to(device).eval()
    # Remember the name: export() writes the config registered under it.
    net.clip_dcl_model_name = name
    return net, preprocess, open_clip.get_tokenizer(name)


#: what OpenCLIP's local-dir loader reads as weights, by the ending of the file's name
WEIGHT_ENDINGS = (".safetensors", ".bin", ".pth")


def check_export(folder: Path, allow_unsafe_pickle: bool = False) -> None:
    """Refuse (``ValueError``, one line naming the file and the fix) an exported folder that OpenCLIP would load
    wrongly or with a traceback: no config, a config that is not JSON, no weights (an export that did not
    finish: OpenCLIP would build a randomly initialised model), weights that are not a safetensors file or a
    weights-only checkpoint. Nothing in the files is run."""
    config = folder / CONFIG_NAME
    if not config.is_file():
        raise ValueError(f"folder {str(folder)!r} holds no {CONFIG_NAME} (not an exported model)")
    try:
        doc = json.loads(config.read_text())
        if not isinstance(doc, dict) or not isinstance(doc.get("model_cfg", {}), dict):
            raise ValueError("not a model config")
    except (OSError, ValueError) as e:
        raise ValueError(f"{str(config)!r} is not a readable model config ({e}); export the model again") from None
    weights = sorted(p for p in folder.iterdir() if p.suffix in WEIGHT_ENDINGS and p.is_file())
    if not weights:
        raise ValueError(
            f"exported folder {str(folder)!r} holds no weights ({WEIGHTS_NAME}): an export that did not finish; "
            "export the model again"
        )
    for path in weights:
        if path.suffix == ".safetensors":
            from safetensors import SafetensorError, safe_open

            try:
                with safe_open(str(path), framework="pt") as f:
                    f.keys()
            except (SafetensorError, OSError, ValueError) as e:
                raise ValueError(
                    f"{str(path)!r} is not a safetensors file (cut or corrupt: {str(e).splitlines()[0][:200]}); "
                    "export the model again"
                ) from None
        else:  # read weights-only first: a pickle that needs code is refused before OpenCLIP reads it
            import zipfile

            with open(path, "rb") as f:
                pickled = f.read(1) == b"\x80"  # a pickle's protocol mark
            if not (pickled or zipfile.is_zipfile(path)):  # random bytes earn no --unsafe-pickle hint
                raise ValueError(
                    f"{str(path)!r} is not a checkpoint (neither torch's zip format nor a pickle); export the "
                    "model again"
                )
            saving.read_checkpoint(path, allow_unsafe_pickle)


def exported_model_name(folder: Path, model: str | None = None) -> str | None:
    """The model name an exported folder records (None for one OpenCLIP wrote); a ``model`` of another
    architecture than the folder's config is a ``ValueError``, not ignored."""
    import open_clip

    doc = json.loads((folder / CONFIG_NAME).read_text())
    entry = doc.get(saving.CKPT_KEY) if isinstance(doc.get(saving.CKPT_KEY), dict) else {}
    recorded = entry.get("model")
    if model is None or model == recorded:
        return recorded
    if recorded is None and open_clip.get_model_config(model) == doc.get("model_cfg", doc):
        return model
    held = f"a {recorded}" if recorded else "a model of another config"
    raise ValueError(
        f"--model {model}: the exported folder {str(folder)!r} holds {held} (its {CONFIG_NAME}), "
        f"which is what it loads: drop --model" + (f" or give --model {recorded}" if recorded else "")
    )


def _plain_file_mode(path: Path) -> None:
    """Give ``path`` the mode a plain ``open(path, "w")`` gives (safetensors writes 0600)."""
    path.chmod(0o666 & ~current_umask())


def export(
    ckpt: str | os.PathLike,
    out_dir: str | os.PathLike,
    model: str | None = None,
    model_config: str | os.PathLike | dict | None = None,
    allow_unsafe_pickle: bool = False,
    force: bool = False,
) -> Path:
    """Write ``ckpt`` as OpenCLIP's ``local-dir`` layout in ``out_dir`` and return ``out_dir``.

    The config holds ``model_cfg``, ``preprocess_cfg`` and, for provenance, ``clip_dcl``. Refuses
    (``ValueError``) a non-empty ``out_dir`` unless ``force``, and non-finite weights.
    """
    import open_clip
    from safetensors.torch import save_file

    out = Path(out_dir)
    if not force and out.exists():
        if not out.is_dir():
            raise ValueError(f"output {str(out)!r} exists and is not a folder")
        held = sorted(p.name for p in out.iterdir())
        if held:
            raise ValueError(
                f"output folder {str(out)!r} is not empty (holds {', '.join(held[:3])}"
                f"{', ...' if len(held) > 3 else ''}); pass --force (force=True) to overwrite"
            )
    net, _, _ = load_checkpoint(ckpt, "cpu", model, model_config, allow_unsafe_pickle)
    from .train.divergence import describe_tensors, nonfinite_tensors

    # the parameters, not the buffers: a causal attention mask holds -inf on purpose
    names, count = nonfinite_tensors(net.named_parameters())
    if count:
        raise ValueError(
            f"checkpoint {str(ckpt)!r} is not a model to export: {describe_tensors(names, count)} (a "
            "training that diverged?); nothing was written"
        )
    if Path(ckpt).is_dir():
        cfg_doc = json.loads((Path(ckpt) / CONFIG_NAME).read_text())
        model_cfg, name = cfg_doc["model_cfg"], cfg_doc.get(saving.CKPT_KEY, {}).get("model")
    else:
        name = net.clip_dcl_model_name
        model_cfg = open_clip.get_model_config(name)
        if model_cfg is None:
            raise ValueError(f"no model config registered for {name!r}")
    pp = dict(getattr(net.visual, "preprocess_cfg", {}) or {})
    preprocess_cfg = {
        k: pp[k] for k in ("size", "mode", "mean", "std", "interpolation", "resize_mode", "fill_color") if k in pp
    }
    doc = {
        "model_cfg": model_cfg,
        "preprocess_cfg": preprocess_cfg,
        saving.CKPT_KEY: {"model": name, "source": str(Path(ckpt).absolute())},
    }
    # Written into a folder beside OUT_DIR and renamed into place: a stop or a full disk between the two
    # writes leaves no OUT_DIR with a config and no weights (which OpenCLIP would load as a random model).
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.", suffix=".partial"))
    try:
        partial.chmod(0o777 & ~current_umask())
        write_json(partial / CONFIG_NAME, doc, indent=2, default=list)
        # Clones: safetensors refuses tensors that share storage.
        tensors = {k: v.detach().cpu().contiguous().clone() for k, v in net.state_dict().items()}
        save_file(tensors, str(partial / WEIGHTS_NAME))
        _plain_file_mode(partial / WEIGHTS_NAME)
        _replace_folder(partial, out)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    log.info("exported %s (%s) to %s", ckpt, name, out)
    return out


def _replace_folder(new: Path, out: Path) -> None:
    """Put the finished export ``new`` at ``out``: renamed there whole, or, into a folder that holds other
    files (``--force``), its files moved in with the config last, so that no moment shows a config beside
    missing or other weights (the earlier config goes first: a folder without one is refused, not misread)."""
    if out.is_dir() and any(out.iterdir()):
        (out / CONFIG_NAME).unlink(missing_ok=True)
        os.replace(new / WEIGHTS_NAME, out / WEIGHTS_NAME)
        os.replace(new / CONFIG_NAME, out / CONFIG_NAME)
        new.rmdir()
        return
    if out.is_dir():
        out.rmdir()
    elif out.exists():
        out.unlink()
    new.rename(out)


def export_main(argv: list[str] | None = None) -> int:
    """``clip-dcl export CKPT OUT_DIR [--model NAME] [--model-config PATH]``."""
    parser = FlagParser(
        prog="clip-dcl export",
        description="Export a checkpoint to OpenCLIP's local-dir layout "
        "(open_clip.create_model_and_transforms('local-dir:OUT_DIR') loads it).",
    )
    parser.add_argument("checkpoint", help="trainer checkpoint (epoch_K.pt) or an exported folder")
    parser.add_argument("out_dir", help="folder to write open_clip_config.json and open_clip_model.safetensors to")
    parser.add_argument("--model", help="OpenCLIP model name, when the checkpoint does not record it")
    parser.add_argument("--model-config", help="model config JSON for a custom architecture")
    parser.add_argument(
        "--unsafe-pickle",
        action="store_true",
        help="load a checkpoint that is not weights-only by full unpickling, which can run code "
        "from the file: only for files you trust",
    )
    parser.add_argument("--force", action="store_true", help="overwrite an export in a non-empty OUT_DIR")
    args = parser.parse_args(argv)
    try:
        out = export(args.checkpoint, args.out_dir, args.model, args.model_config, args.unsafe_pickle, args.force)
    except ValueError as e:
        print(f"clip-dcl export: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a read-only folder, a full disk: nothing was left at OUT_DIR
        print(
            f"clip-dcl export: cannot write {e.filename or args.out_dir!r} ({e.strerror or e}): free space or give "
            f"an OUT_DIR you can write in; {args.out_dir!r} is as it was",
            file=sys.stderr,
        )
        return exitcodes.FAILED
    except KeyboardInterrupt:
        print(f"clip-dcl export: interrupted (Ctrl-C); {args.out_dir!r} is as it was", file=sys.stderr)
        return exitcodes.INTERRUPTED
    print(f"exported to {out}; load with open_clip.create_model_and_transforms('local-dir:{out}')")
    return 0
