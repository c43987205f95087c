"""``clip_dcl.train`` with a signal sent to this process after a given optimizer step (for the tests).

``python tests/distributed/preempt_train.py ARGS`` (or under torchrun) trains as ``-m clip_dcl.train``;
with ``PREEMPT_AT_STEP=K`` (and ``PREEMPT_RANK=R``, default every rank) the process sends itself
``PREEMPT_SIGNAL`` (default SIGTERM) right after its K-th optimizer step, from an optimizer hook, which
is where a scheduler's signal lands in a real run: in the middle of an epoch, between two steps.
"""
import os
import signal
import sys




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
            os.kill(os.getpid(), sig)

    from torch.optim.optimizer import register_optimizer_step_post_hook

    register_optimizer_step_post_hook(hook)


if __name__ == "__main__":
    _install()
    from clip_dcl.train import main

    sys.exit(main(sys.argv[1:]))
