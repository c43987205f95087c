"""Refusals of a resume whose saved loss state the configured loss would misread; each message names
the flags that continue the same training, and ``--loss-reset`` (or ``--decl-grow-state``).
"""

from __future__ import annotations

import logging
from typing import Optional

from . import saving
from .flags import TrainConfig
from .loss_flags import loss_command, setting_words


class LossStateMismatch(RuntimeError):
    """The checkpoint being resumed holds loss state that the configured loss cannot take."""


class ObjectiveMismatch(LossStateMismatch):
    """The checkpoint being resumed was trained with another ``--loss`` than the one configured."""


class LossSettingMismatch(LossStateMismatch):
    """The checkpoint was trained with another value of a ``state_settings`` setting, or another id count."""


def check_objective(cfg: TrainConfig, ckpt: dict, path) -> None:
    """Refuse to resume a checkpoint trained with another ``--loss``, unless ``--loss-reset``."""
    entry = ckpt.get(saving.CKPT_KEY)
    saved = entry.get("loss") if isinstance(entry, dict) else None
    if saved is None or saved == cfg.loss or cfg.loss_reset:
        return
    saved_flags = " ".join(loss_command(saved, entry.get("loss_args") or {}))
    raise ObjectiveMismatch(
        f"{path} was trained with {saved_flags}; resuming it with --loss {cfg.loss} would change the "
        f"objective. To continue the same training, add: {saved_flags}. To train --loss {cfg.loss} from "
        f"this checkpoint on purpose (the saved loss state is dropped), add --loss-reset."
    )


def check_state_settings(cfg: TrainConfig, ckpt: dict, path) -> Optional[int]:
    """Refuse to resume loss state that this run's settings would read as another quantity (a differing
    `state_meaning` value, or another id count unless ``--decl-grow-state``: then that count is returned)."""
    from clip_dcl.losses import LOSSES

    entry = ckpt.get(saving.CKPT_KEY)
    if not isinstance(entry, dict) or entry.get("loss") != cfg.loss or cfg.loss_reset or cfg.loss not in LOSSES:
        return None
    cls = LOSSES[cfg.loss]
    then = cls.state_meaning(entry.get("loss_args") or {})
    now = cls.state_meaning(cfg.loss_args)
    changed = [k for k in then if k in now and then[k] != now[k]]
    if changed:
        saved = " ".join(w for k in changed for w in setting_words(cfg.loss, k, then[k]))
        given = " ".join(w for k in changed for w in setting_words(cfg.loss, k, now[k]))
        raise LossSettingMismatch(
            f"{path} was trained with {saved}; resuming it with {given} would read its saved --loss {cfg.loss} "
            f"state as another quantity. To continue the same training, add: {saved}. To train with {given} "
            "from this checkpoint on purpose (the loss state starts fresh; the model and optimizer are kept), "
            "add --loss-reset."
        )
    return _check_num_samples(cfg, entry, path)


def _check_num_samples(cfg: TrainConfig, entry: dict, path) -> Optional[int]:
    """A per-sample buffer saved for another id count: refused, or with ``--decl-grow-state`` its count returned."""
    now = cfg.loss_args.get("num_samples") if cfg.num_samples is not None else None
    index = entry.get(saving.SHARD_INDEX_KEY)
    saved = (index or {}).get("num_samples", (entry.get("loss_args") or {}).get("num_samples"))
    if now is None or saved is None or int(saved) == int(now):
        return None
    saved, now = int(saved), int(now)
    reset = "add --loss-reset to start the whole loss state fresh (the model and optimizer are kept)"
    if now > saved:
        if cfg.grow_state and cfg.id_block is not None and saved % cfg.id_block:
            raise LossSettingMismatch(
                f"--decl-grow-state keeps every id's rate in its place, but with ::-joined sources the ids of "
                f"source j start at j x {cfg.id_block} (the block of each source), and {path}'s {saved} ids were "
                "laid out in other blocks: the rates would move to other samples. Add --loss-reset instead, or "
                f"resume with the --decl-num-samples that gives the saved blocks."
            )
        if cfg.grow_state:
            logging.info(
                f"--decl-grow-state: {path} holds the rates of {saved} sample ids; they are kept, "
                f"and the {now - saved} new ids [{saved}, {now}) start unvisited."
            )
            return saved
        raise LossSettingMismatch(
            f"{path} holds --loss {cfg.loss} state for {saved} sample ids, and this run needs {now} "
            f"(--decl-num-samples {now}: the training data's size unless given): the data set grew. Either "
            f"add --decl-grow-state to keep the learned rates of the {saved} ids seen and start the "
            f"{now - saved} new ids unvisited, as a fresh buffer starts them; or {reset}."
        )
    raise LossSettingMismatch(
        f"{path} holds --loss {cfg.loss} state for {saved} sample ids, and this run has --decl-num-samples {now} "
        f"(the training data's size unless given): the data set shrank. Either add --decl-num-samples {saved} to "
        f"keep the learned rates (every id of the smaller data set is below it); or {reset}."
    )
