"""``clip_dcl.train`` with a signal sent to this process after a given optimizer step (for the tests).

``python tests/distributed/preempt_train.py ARGS`` (or under torchrun) trains as ``-m clip_dcl.train``;
with ``PREEMPT_AT_STEP=K`` (and ``PREEMPT_RANK=R``, default every rank) the process sends
``PREEMPT_SIGNAL`` (default SIGTERM) to itself and to its child processes (its data-loader workers),
as Slurm signals every process of a task, right after its K-th optimizer step, from an optimizer
hook: in the middle of an epoch, between two steps.
"""
import os
import signal
import subprocess
import sys




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


if __name__ == "__main__":
    _install()
    from clip_dcl.train import main

    sys.exit(main(sys.argv[1:]))
