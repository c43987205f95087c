"""``clip_dcl.train`` with a signal sent to this process after a given optimizer step (for the tests).

``python tests/distributed/preempt_train.py ARGS`` (or under torchrun) trains as ``-m clip_dcl.train``;
with ``PREEMPT_AT_STEP=K`` (and ``PREEMPT_RANK=R``, default every rank) the process sends
``PREEMPT_SIGNAL`` (default SIGTERM) to itself and to its child processes (its data-loader workers),
as Slurm signals every process of a task, right after its K-th optimizer step, from an optimizer
hook: in the middle of an epoch, between two steps. With ``SIGINT_IN_SAVE=1`` a SIGINT also reaches
this process while its mid-epoch checkpoint is being written (a second Ctrl-C in the save), after its
first bytes. With ``PAUSE_AT_STEP=K`` and ``PAUSE_FILE=PATH`` the process writes ``PATH.paused`` right after
its K-th optimizer step and waits (at most two minutes) until ``PATH`` exists: a run held mid-epoch, alive,
while a test does something beside it. With ``FREEZE_RANK=R`` and ``PAUSE_FILE=PATH`` rank R writes its pid to
``PATH.frozen`` before it starts and sleeps (a rank that never reaches the rendezvous); with ``PAUSE_FILE`` every
other rank writes ``PATH.rdzv.RANK`` as it enters ``init_process_group`` (it waits there for the frozen one).
With ``STARTUP_PAUSE=1`` and ``PAUSE_FILE=PATH`` the process writes ``PATH.startup`` as it builds its loss (the
model is built, no step taken) and waits there (at most a minute): a run held in start-up.
"""

import os
import signal
import subprocess
import sys
import time


def _children(pid: int) -> list:
    out = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return out


def _install() -> None:
    at = int(os.environ.get("PREEMPT_AT_STEP", "0"))
    rank = os.environ.get("PREEMPT_RANK")
    if not at or (rank is not None and os.environ.get("RANK", "0") != rank):
        return
    sig = getattr(signal, os.environ.get("PREEMPT_SIGNAL", "SIGTERM"))
    steps = [0]

    def hook(optimizer, args, kwargs):
        steps[0] += 1
        if steps[0] == at:
            # from another process, as the scheduler's: a data-loader worker exits quietly on a SIGTERM from
            # its parent, and dies of one from anyone else
            children = [str(c) for c in _children(os.getpid())]
            subprocess.run(["kill", f"-{sig.name[3:]}", *children, str(os.getpid())], check=True)

    from torch.optim.optimizer import register_optimizer_step_post_hook

    register_optimizer_step_post_hook(hook)


def _pause() -> None:
    at, release = int(os.environ.get("PAUSE_AT_STEP", "0")), os.environ.get("PAUSE_FILE")
    if not at or not release:
        return
    steps = [0]

    def hook(optimizer, args, kwargs):
        steps[0] += 1
        if steps[0] == at:
            with open(release + ".paused", "w") as f:
                f.write(str(os.getpid()))
            deadline = time.monotonic() + 120
            while not os.path.exists(release) and time.monotonic() < deadline:
                time.sleep(0.1)

    from torch.optim.optimizer import register_optimizer_step_post_hook

    register_optimizer_step_post_hook(hook)


class _Interrupting:
    """A file that sends this process SIGINT once its first 4 KB are written (the handler raises inside torch.save)."""

    def __init__(self, f):
        self.f, self.written, self.sent = f, 0, False

    def write(self, data):
        n = self.f.write(data)
        self.written += n
        if self.written > 4096 and not self.sent:
            self.sent = True
            os.kill(os.getpid(), signal.SIGINT)
        return n

    def flush(self):
        self.f.flush()


def _interrupt_saves() -> None:
    if os.environ.get("SIGINT_IN_SAVE") != "1":
        return
    from clip_dcl.train.run import TrainingRun

    save = TrainingRun._torch_save
    TrainingRun._torch_save = staticmethod(lambda obj, fh: save(obj, _Interrupting(fh)))


def _freeze() -> None:
    rank, marker = os.environ.get("FREEZE_RANK"), os.environ.get("PAUSE_FILE")
    if rank is None or not marker:
        return
    if os.environ.get("RANK") == rank:
        with open(marker + ".frozen", "w") as f:
            f.write(str(os.getpid()))
        time.sleep(600)
        return
    import torch.distributed

    init = torch.distributed.init_process_group

    def init_process_group(*args, **kwargs):
        with open(f"{marker}.rdzv.{os.environ.get('RANK')}", "w") as f:
            f.write(str(os.getpid()))
        return init(*args, **kwargs)

    torch.distributed.init_process_group = init_process_group


def _startup_pause() -> None:
    marker = os.environ.get("PAUSE_FILE")
    if os.environ.get("STARTUP_PAUSE") != "1" or not marker:
        return
    from clip_dcl.train.run import TrainingRun

    create = TrainingRun.create_loss

    def create_loss(self, args):
        with open(marker + ".startup", "w") as f:
            f.write(str(os.getpid()))
        time.sleep(60)
        return create(self, args)

    TrainingRun.create_loss = create_loss


if __name__ == "__main__":
    _freeze()
    _startup_pause()
    _install()
    _pause()
    _interrupt_saves()
    from clip_dcl.train import main

    sys.exit(main(sys.argv[1:], exiting=True))
