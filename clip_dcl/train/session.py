"""A training run: OpenCLIP's parts called in the order of OpenCLIP's own ``main``, around our epoch loop.

:func:`train` is OpenCLIP's ``main`` as a caller of its library: its parser, distributed set-up, model factory,
tokenizer, data readers, optimizer groups, schedulers, loggers and evaluation, in that order; the run's own
decisions (the run folder, the loss and its state, resume, what a checkpoint holds and when it is written) are
plain calls of :class:`~clip_dcl.train.run.TrainingRun`, and each epoch is :mod:`clip_dcl.train.loop`'s.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import glob
import logging
import math
import os
import pickle
import re
import shutil
import warnings
from datetime import datetime
from typing import Optional

import numpy as np
import torch
from open_clip import create_model_and_transforms, get_tokenizer, trace_model
from open_clip_train import main as oc_main
from open_clip_train import params as oc_params
from open_clip_train import scheduler as oc_scheduler
from open_clip_train.distributed import broadcast_object, init_distributed_device, is_master
from open_clip_train.file_utils import remote_sync, start_sync_process

from . import saving
from . import signals as preemption
from .compat import cpu_safe_ddp, init_process_group_timeout
from .exits import stop_exit_code
from .flags import TrainConfig, same_named
from .run import TrainingRun

__all__ = ["train", "run_training", "PeerFailure", "collective_failed"]
LATEST = "epoch_latest.pt"  # OpenCLIP's name for --save-most-recent
#: The flags passed to OpenCLIP's model factory under their own names.
MODEL_FLAGS = (
    "precision", "force_quick_gelu", "force_custom_text", "force_patch_dropout", "force_image_size", "image_mean",
    "image_std", "image_interpolation", "image_resize_mode", "aug_cfg", "pretrained_image", "cache_dir",
)  # fmt: skip


def _log_dir(argv) -> Optional[str]:
    """``--logs/--name`` of an OpenCLIP command line, when a name is given (else one is made up)."""
    args = oc_params.parse_args(list(argv))
    if not args.name or not args.logs or args.logs.lower() == "none":
        return None
    return os.path.join(args.logs, args.name)


class PeerFailure(RuntimeError):
    """A collective with the other ranks failed (a rank died, or ``--dist-timeout`` ran out)."""


#: What the process-group backends say when a peer is gone or a collective timed out (gloo raises a plain
#: RuntimeError; torch's own DistError types are recognised by class).
_COLLECTIVE_FAILURE = re.compile(
    r"Connection (?:closed|reset) by peer|[Tt]imed out|gloo/transport|NCCL error|"
    r"ProcessGroup\w* .*(?:aborted|timeout)|Broken pipe"
)


def collective_failed(err: BaseException) -> bool:
    """Whether ``err`` is a failed collective (a dead or hung peer), not an error of this rank's own."""
    dist = getattr(torch.distributed, "DistError", ())
    if dist and isinstance(err, dist):
        return True
    return isinstance(err, RuntimeError) and bool(_COLLECTIVE_FAILURE.search(str(err)))


def _first_line(err: BaseException) -> str:
    """The error's first line without the backend's source location and advice ("[.../pair.cc:561] ...")."""
    lines = [line for line in str(err).strip().splitlines() if line.strip()]
    text = re.sub(r"^\[[^\]]*\]\s*", "", lines[0] if lines else "")
    text = text.split(" This is typically")[0]
    return f"{type(err).__name__}: {text}".rstrip(": ")


def run_training(config: TrainConfig, at_once: bool = False) -> int:
    """Train with ``config`` (:func:`train`); return an exit code. A run that fails before writing any
    checkpoint removes the ``--logs/--name`` folder it created, so the command can run again."""
    run = TrainingRun(config)
    log_dir = _log_dir(config.openclip_argv)
    created = log_dir is not None and not os.path.exists(log_dir)
    result = -1
    cleaned = []

    def clean_up():  # once: on the way out, or before a stop during start-up ends the process (leave_now)
        if cleaned:
            return
        cleaned.append(True)
        # only the holder of the folder's lock: a run refused there must not remove the folder of the one running
        if (
            result != 0  # a finished run keeps its folder, checkpoints or not (--save-frequency 0)
            and created
            and run.lock is not None
            and os.path.isdir(log_dir)
            and not glob.glob(os.path.join(log_dir, "checkpoints", "**", "*.pt"), recursive=True)
        ):
            shutil.rmtree(log_dir, ignore_errors=True)
            logging.error(
                f"The run failed before writing a checkpoint; removed {log_dir}, so the same command can be run again."
            )
        if run.lock is not None:
            run.lock.release()

    if config.preempt.signals:  # before main starts the data workers, which inherit the handlers
        run.signals = preemption.StopSignals(config.preempt.signals, ctrl_c=True, at_once=at_once)
        run.signals.on_forced_exit = clean_up
        run.signals.install()
    try:
        with warnings.catch_warnings():
            # OpenCLIP's loaders ask for pinned memory; without a GPU torch warns once a loader that it is not used
            warnings.filterwarnings("ignore", message=".*'pin_memory' argument is set as true but no accelerator")
            result = train(run)
    except preemption.Preempted as e:
        result = stop_exit_code(e.signame)
        if e.path:
            how = (
                f"run {run.rerun(f'--resume latest (or --resume {e.path})')}; it continues at step {e.step} of "
                f"epoch {e.epoch}"
            )
        elif run.args is not None and run.args.rank == 0:
            how = "no checkpoint was written (no --logs)"
        else:
            how = "rank 0 saved the checkpoint"
        logging.warning(f"Stopped on {e.signame} after step {e.step} of epoch {e.epoch}: {how}. Exit code {result}.")
    except RuntimeError as e:
        if not (getattr(run.args, "world_size", 1) > 1 and collective_failed(e)):
            raise
        rank = getattr(run.args, "rank", "?") if run.args is not None else "?"
        raise PeerFailure(
            f"rank {rank}: a collective with the other ranks failed, so this rank stops: "
            f"{_first_line(e)} (another rank died or hangs? its own log says why; --dist-timeout "
            "bounds the wait for a rank that hangs)"
        ) from None
    finally:
        if run.signals is not None:
            run.signals.restore()
        clean_up()
    return int(result)


def _run_name(args) -> str:
    """OpenCLIP's name for a run without ``--name``: the clock and the main settings (rank 0's clock)."""
    date = datetime.now().strftime("%Y_%m_%d-%H_%M_%S")
    if args.distributed:
        date = broadcast_object(args, date)
    model = args.model.replace("/", "-")
    return "-".join(
        [date, f"model_{model}", f"lr_{args.lr}", f"b_{args.batch_size}", f"j_{args.workers}", f"p_{args.precision}"]
    )


def _latest(args) -> Optional[str]:
    """``--resume latest``: the newest checkpoint of the run (OpenCLIP's rules: ``epoch_latest.pt`` with
    ``--save-most-recent``, else the last ``*.pt`` in natural order), found by rank 0 and shared."""
    found = None
    folder = args.checkpoint_path
    if args.remote_sync is not None:
        folder = os.path.join(args.remote_sync, args.name, "checkpoints")
        if args.save_most_recent:
            raise SetupError("--save-most-recent cannot be combined with --remote-sync and --resume latest")
        if args.remote_sync_protocol != "s3":
            raise SetupError(f"--remote-sync-protocol {args.remote_sync_protocol}: --resume latest reads s3 only")
    if is_master(args):
        if args.save_most_recent:
            found = os.path.join(folder, LATEST) if os.path.exists(os.path.join(folder, LATEST)) else None
        else:
            found = oc_main.get_latest_checkpoint(folder, remote=args.remote_sync is not None)
        logging.info(
            f"Found latest resume checkpoint at {found}."
            if found
            else f"No latest resume checkpoint found in {folder}."
        )
    if args.distributed:
        found = broadcast_object(args, found)
    return found


class SetupError(RuntimeError):
    """A run that cannot start as configured (a remote sync that fails, flags that do not combine)."""


def _optimizer(model, args, adamw_impl: Optional[str]):
    """OpenCLIP's optimizer: AdamW without weight decay on gains, biases and the logit scale, or a timm one."""
    opt = getattr(args, "opt", "adamw").lower()
    if opt.startswith("timm/"):
        from timm.optim import create_optimizer_v2

        extra = {}
        if args.beta1 is not None:
            extra["betas"] = (args.beta1, args.beta2)
        if getattr(args, "momentum", None) is not None:
            extra["momentum"] = args.momentum
        return create_optimizer_v2(
            model, opt.split("timm/")[-1], lr=args.lr, weight_decay=args.wd, eps=args.eps, **extra
        )
    if opt != "adamw":
        raise SetupError(f"--opt {opt}: unknown optimizer (adamw, or timm/NAME)")

    def exclude(n, p):
        return p.ndim < 2 or "bn" in n or "ln" in n or "bias" in n or "logit_scale" in n

    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    return torch.optim.AdamW(
        [
            {"params": [p for n, p in named if exclude(n, p)], "weight_decay": 0.0},
            {"params": [p for n, p in named if not exclude(n, p)], "weight_decay": args.wd},
        ],
        lr=args.lr,
        betas=(args.beta1, args.beta2),
        eps=args.eps,
        **({adamw_impl: True} if adamw_impl else {}),
    )


def _scheduler(optimizer, args, num_batches: int):
    total = (num_batches // args.accum_freq) * args.epochs
    if args.lr_scheduler == "cosine":
        return oc_scheduler.cosine_lr(optimizer, args.lr, args.warmup, total)
    if args.lr_scheduler == "const":
        return oc_scheduler.const_lr(optimizer, args.lr, args.warmup, total)
    if args.epochs_cooldown is None:
        raise SetupError("--lr-scheduler const-cooldown needs --epochs-cooldown")
    cooldown = (num_batches // args.accum_freq) * args.epochs_cooldown
    return oc_scheduler.const_lr_cooldown(
        optimizer, args.lr, args.warmup, total, cooldown, args.lr_cooldown_power, args.lr_cooldown_end
    )


def log_to_file(text: str) -> None:
    """``text`` into the run's ``out.log`` only (the root logger's file handlers): what a person reads stays
    on the console, the whole record in the file."""
    record = logging.LogRecord("root", logging.INFO, __file__, 0, text, None, None)
    for handler in logging.root.handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)


def _write_params(args) -> None:
    """``params.txt`` (OpenCLIP's format: ``name: value`` a line) and the same in ``out.log``, on rank 0."""
    lines = [f"{name}: {getattr(args, name)}" for name in sorted(vars(args))]
    log_to_file("Params:\n  " + "\n  ".join(lines))
    with open(os.path.join(args.logs, args.name, "params.txt"), "w") as f:
        f.write("".join(line + "\n" for line in lines))


def train(run: TrainingRun) -> int:
    """Set up and train one run with ``run.config``; 0 when every epoch ran."""
    config = run.config
    args = run.parse_args(list(config.openclip_argv))
    if torch.cuda.is_available():
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.benchmark = True
        torch.backends.cudnn.deterministic = False
    with init_process_group_timeout(config.dist_timeout), warnings.catch_warnings():
        # a missing GPU was said in the user's words when the flags were read (clip_dcl.train.precision)
        warnings.filterwarnings("ignore", message="Device .* was not available, falling back to CPU")
        device = init_distributed_device(args)
    if args.name is None:
        args.name = _run_name(args)
    base = os.path.join(args.logs, args.name)
    args.log_path = None
    if is_master(args, local=args.log_local):
        os.makedirs(base, exist_ok=True)
        args.log_path = os.path.join(base, f"out-{args.rank}" if args.log_local else "out.log")
    args.log_level = logging.DEBUG if args.debug else logging.INFO
    run.setup_logging(args.log_path, args.log_level)  # claims the run folder first

    args.wandb = "wandb" in args.report_to or "all" in args.report_to
    args.tensorboard = "tensorboard" in args.report_to or "all" in args.report_to
    args.checkpoint_path = os.path.join(base, "checkpoints")
    args.tensorboard_path = os.path.join(base, "tensorboard") if args.tensorboard and is_master(args) else ""
    if is_master(args):
        for folder in (args.tensorboard_path, args.checkpoint_path):
            if folder:
                os.makedirs(folder, exist_ok=True)
    if run.resume_latest and args.resume == "latest":
        args.resume = _latest(args)
    if args.copy_codebase:
        oc_main.copy_codebase(args)
    syncing = None
    if is_master(args) and args.remote_sync is not None:
        remote = os.path.join(args.remote_sync, args.name)
        if not remote_sync(base, remote, args.remote_sync_protocol):
            raise SetupError(f"--remote-sync {args.remote_sync}: the first sync of {base} failed")
        logging.info("remote sync successful.")
        syncing = start_sync_process(args.remote_sync_frequency, base, remote, args.remote_sync_protocol)
        syncing.start()
    if args.precision == "fp16":
        logging.warning("fp16 training is less tested than --precision amp; prefer amp.")
    if args.distributed:
        logging.info(
            f"Running in distributed mode with multiple processes. Device: {args.device}. "
            f"Process (global: {args.rank}, local {args.local_rank}), total {args.world_size}."
        )
    else:
        logging.info(f"Running with a single process. Device {args.device}.")

    args.distill = args.distill_model is not None and args.distill_pretrained is not None
    if args.distill and (args.accum_freq != 1 or "coca" in args.model.lower()):
        raise SetupError("--distill-model works with --accum-freq 1 and a model other than CoCa")
    if isinstance(args.force_image_size, (tuple, list)) and len(args.force_image_size) == 1:
        args.force_image_size = args.force_image_size[0]
    oc_main.random_seed(args.seed, 0)
    model_kwargs = {}
    if args.siglip:
        model_kwargs = {"init_logit_scale": np.log(10), "init_logit_bias": -10}
    if config.init_logit_scale is not None:
        model_kwargs["init_logit_scale"] = math.log(config.init_logit_scale)
    if getattr(args, "force_context_length", None) is not None:  # OpenCLIP 3.x
        model_kwargs["force_context_length"] = args.force_context_length
    with _pretrained_read(args.pretrained):
        model, preprocess_train, preprocess_val = create_model_and_transforms(
            args.model,
            args.pretrained,
            device=device,
            jit=args.torchscript,
            output_dict=True,
            **same_named(args, MODEL_FLAGS),
            **model_kwargs,
        )
    dist_model = None
    if args.distill:
        dist_model, _, _ = create_model_and_transforms(
            args.distill_model,
            args.distill_pretrained,
            device=device,
            precision=args.precision,
            output_dict=True,
            cache_dir=args.cache_dir,
        )
    if args.use_bnb_linear is not None:
        import bitsandbytes as bnb
        from open_clip.utils import replace_linear

        replace_linear(model, getattr(bnb.nn.triton_based_modules, args.use_bnb_linear))
        model = model.to(device)
    oc_main.random_seed(args.seed, args.rank)
    if args.trace:
        model = trace_model(model, batch_size=args.batch_size, device=device)
    if args.lock_image:
        model.lock_image_tower(
            unlocked_groups=args.lock_image_unlocked_groups, freeze_bn_stats=args.lock_image_freeze_bn_stats
        )
    if args.lock_text:
        model.lock_text_tower(
            unlocked_layers=args.lock_text_unlocked_layers, freeze_layer_norm=args.lock_text_freeze_layer_norm
        )
    if args.grad_checkpointing:
        model.set_grad_checkpointing()
    if is_master(args):
        params = sum(p.numel() for p in model.parameters())
        logging.info(f"Model: {args.model}, {params / 1e6:.2f} M parameters, on {device}.")
        log_to_file(f"Model:\n{model}")

    if args.distributed and not args.horovod:
        if args.use_bn_sync:
            model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
        ddp_args = {"static_graph": True} if args.ddp_static_graph else {}
        model = cpu_safe_ddp(model, device_ids=[device], **ddp_args)
        if args.distill:
            dist_model = cpu_safe_ddp(dist_model, device_ids=[device], **ddp_args)

    optimizer = scaler = None
    if args.train_data or args.dataset_type == "synthetic":
        if args.trace:
            raise SetupError("--trace: a traced model cannot be trained")
        optimizer = _optimizer(model, args, config.adamw_impl)
        if is_master(args):
            defaults = {**copy.deepcopy(optimizer.defaults), "weight_decay": args.wd}
            logging.info(
                f"Created {type(optimizer).__name__} ({args.opt}) optimizer: "
                + ", ".join(f"{k}: {v}" for k, v in defaults.items())
            )
        if args.horovod:
            import horovod.torch as hvd

            optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
            hvd.broadcast_parameters(model.state_dict(), root_rank=0)
            hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        if args.precision == "amp":
            scaler = torch.amp.GradScaler(device=device.type)

    start_epoch = 0
    if args.resume is not None:
        checkpoint = run.pt_load(args.resume, map_location="cpu")
        if "epoch" in checkpoint:  # a training checkpoint: model, optimizer, scaler, epoch
            start_epoch = checkpoint["epoch"]
            model.load_state_dict(checkpoint["state_dict"])
            if optimizer is not None:
                optimizer.load_state_dict(checkpoint["optimizer"])
            if scaler is not None and "scaler" in checkpoint:
                scaler.load_state_dict(checkpoint["scaler"])
            logging.info(f"=> resuming checkpoint '{args.resume}' (epoch {start_epoch})")
        else:  # a bare state dict: fine-tuning or evaluation
            model.load_state_dict(checkpoint)
            logging.info(f"=> loaded checkpoint '{args.resume}' (epoch {start_epoch})")
        del checkpoint  # its weights are in the model now: no second copy kept through the training

    context = getattr(args, "force_context_length", None)
    tokenizer = get_tokenizer(args.model, cache_dir=args.cache_dir, **({"context_length": context} if context else {}))
    data = run.get_data(args, (preprocess_train, preprocess_val), epoch=start_epoch, tokenizer=tokenizer)
    if not data:
        raise SetupError("no data: give --train-data, --val-data, --imagenet-val or --dataset-type synthetic")
    scheduler = None
    if "train" in data and optimizer is not None:
        scheduler = _scheduler(optimizer, args, data["train"].dataloader.num_batches)

    args.save_logs = bool(args.logs and args.logs.lower() != "none" and is_master(args))
    writer = None
    if args.save_logs and args.tensorboard:
        import torch.utils.tensorboard as tensorboard

        writer = tensorboard.SummaryWriter(args.tensorboard_path)
    original = model
    if args.torchcompile:
        logging.info("Compiling model...")
        if args.grad_checkpointing and args.distributed:
            torch._dynamo.config.optimize_ddp = False
        model = torch.compile(original)

    if "train" not in data:
        if args.use_bnb_linear is not None:
            from open_clip.utils import convert_int8_model_to_inference_mode

            convert_int8_model_to_inference_mode(model)
        run.evaluate(model, data, start_epoch, args, tb_writer=writer, tokenizer=tokenizer)
        return 0

    loss = run.create_loss(args)
    if is_master(args) and args.logs and args.logs.lower() != "none":
        _write_params(args)
    if args.wandb and is_master(args):
        import wandb

        args.train_sz = data["train"].dataloader.num_samples
        if args.val_data is not None:
            args.val_sz = data["val"].dataloader.num_samples
        wandb.init(
            project=args.wandb_project_name,
            name=args.name,
            id=args.name,
            notes=args.wandb_notes,
            tags=[],
            resume="auto" if run.resume_latest else None,
            config=vars(args),
        )
        if args.debug:
            wandb.watch(model, log="all")
        wandb.save(os.path.join(base, "params.txt"))

    with _setup_frozen():
        for epoch in range(start_epoch, args.epochs):
            if is_master(args):
                logging.info(f"Start epoch {epoch}")
            run.train_one_epoch(
                model, data, loss, epoch, optimizer, scaler, scheduler, dist_model, args, tb_writer=writer
            )
            done = epoch + 1
            if any(v in data for v in ("val", "imagenet-val", "imagenet-v2")):
                run.evaluate(model, data, done, args, tb_writer=writer, tokenizer=tokenizer)
                _barrier(args)
            if args.save_logs:
                _save_epoch(run, original, optimizer, scaler, done, args)
            _barrier(args)

    if args.wandb and is_master(args):
        import wandb

        wandb.finish()
    if args.save_logs:
        _say_where(run, args)
    if syncing is not None:
        syncing.terminate()
        ok = remote_sync(base, os.path.join(args.remote_sync, args.name), args.remote_sync_protocol)
        logging.info("Final remote sync successful." if ok else "Final remote sync failed.")
    return 0


@contextlib.contextmanager
def _setup_frozen():
    """The set-up's objects (modules, the model, the data pipeline: hundreds of thousands) out of the garbage
    collector's sight while the run trains (``gc.freeze``), given back after: a full collection walks every object
    it sees, and one that comes in the middle of a step stalls the step (and the GPU's queue) that long."""
    if gc.get_freeze_count():  # a caller that froze its own objects manages the collector: left as it is
        yield
        return
    gc.freeze()  # the set-up's garbage with them: it goes once they are given back
    try:
        yield
    finally:
        gc.unfreeze()


@contextlib.contextmanager
def _pretrained_read(pretrained: Optional[str]):
    """A ``--pretrained`` file that OpenCLIP cannot read: one line naming it (a pickle that asks for objects, which
    weights-only loading refuses, apart from bytes that are no checkpoint at all)."""
    try:
        yield
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError) as e:
        if not (pretrained and os.path.isfile(pretrained)):
            raise
        chain = [e]
        while chain[-1].__cause__ or chain[-1].__context__:  # OpenCLIP may raise its own around torch's
            chain.append(chain[-1].__cause__ or chain[-1].__context__)
        text = "\n".join(str(c) for c in chain)
        if any(isinstance(c, pickle.UnpicklingError) for c in chain) and "unsupported global" in text.lower():
            raise saving.UnsafeCheckpoint(
                f"--pretrained {pretrained} does not load as weights only: it asks for Python objects, which can "
                "run code; load only a file you trust, converted to a plain state dict"
            ) from None
        text = text.split("WeightsUnpickler error:", 1)[-1]  # torch's own detail, after its advice
        first = next((ln.strip() for ln in text.splitlines() if ln.strip()), type(e).__name__)
        raise saving.CheckpointUnreadable(
            f"--pretrained {pretrained} is not a checkpoint OpenCLIP can read ({first})"
        ) from None


def _barrier(args) -> None:
    if not args.distributed:
        return
    if args.horovod:
        import horovod.torch as hvd

        hvd.join()
    else:
        torch.distributed.barrier()


def _save_epoch(run: TrainingRun, model, optimizer, scaler, done: int, args) -> None:
    """The epoch's checkpoints as OpenCLIP writes them: ``epoch_N.pt`` every ``--save-frequency`` epochs and at
    the last, ``epoch_latest.pt`` with ``--save-most-recent``; ``--delete-previous-checkpoint`` removes the
    previous epoch's. Each write is atomic and holds the loss state (:meth:`TrainingRun.save`)."""
    ckpt = {"epoch": done, "name": args.name, "state_dict": model.state_dict(), "optimizer": optimizer.state_dict()}
    if scaler is not None:
        ckpt["scaler"] = scaler.state_dict()
    if saving.numbered(args, done):
        run.save(ckpt, os.path.join(args.checkpoint_path, f"epoch_{done}.pt"))
    if args.delete_previous_checkpoint:
        previous = os.path.join(args.checkpoint_path, f"epoch_{done - 1}.pt")
        if os.path.exists(previous):
            os.remove(previous)
    if args.save_most_recent:
        run.save(ckpt, os.path.join(args.checkpoint_path, LATEST))


def _held_out(args) -> Optional[str]:
    """Pairs to evaluate on: ``--val-data``, else the ``val`` folder beside a training split that
    `clip-dcl data shards` or `data synth` wrote."""
    if args.val_data:
        return args.val_data
    train = (args.train_data or "").split("::")[0]
    val = os.path.join(os.path.dirname(os.path.dirname(train)), "val") if train else ""
    return val if val and glob.glob(os.path.join(glob.escape(val), "*.tar")) else None


def _say_where(run: TrainingRun, args) -> None:
    """The run's last lines: where its model is, and the commands that evaluate and export it, runnable as
    printed."""
    import shlex

    from .runfolder import latest_checkpoint

    path = latest_checkpoint(args.checkpoint_path, args.save_most_recent)
    if path is None:
        logging.info(f"Done: {args.epochs} epoch(s); no checkpoint was written (--save-frequency 0?).")
        return
    val = _held_out(args)
    data = shlex.quote(val) if val else "HELD_OUT_PAIRS  # shards or a CSV of pairs not trained on"
    logging.info(f"Done: {args.epochs} epoch(s); the model is in {path}")
    logging.info(f"Evaluate it: clip-dcl eval retrieval --checkpoint {shlex.quote(path)} --data {data}")
    export = shlex.quote(os.path.join(args.logs, args.name, "export"))
    logging.info(f"Export it for OpenCLIP: clip-dcl export {shlex.quote(path)} {export}")
