"""How a failed run leaves: its one error line last, whatever its data-loader workers and its saves were doing.

:func:`stop_loader_workers` shuts down the workers of every data loader still alive in this process.
A run that fails leaves its loaders' persistent workers running until the interpreter exits; there,
``multiprocessing``'s exit handler terminates them (SIGTERM: exit code 143) and PyTorch's SIGCHLD
handler, which still counts them as its workers, raises "DataLoader worker (pid N) exited
unexpectedly with exit code 143" inside that exit handler: a traceback printed after the run's
error line, in some runs and not others (it depends on which worker the collector reached first).
Shut down by PyTorch's own shutdown (workers told to stop, joined, then removed from that handler's
list), they exit quietly.

"""
from __future__ import annotations

import gc
import logging


def stop_loader_workers() -> int:
    """Shut down the worker processes of every multiprocessing data-loader iterator of this process;
    return how many iterators were shut down. Call it only when no loader will be read again."""
    from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter

    stopped = 0
    # The iterators are held by OpenCLIP's main (its ``data``), which the failure has left: found by type
    # (``type()``, not ``isinstance``, which would ask every object for its ``__class__``, and some warn).
    for obj in gc.get_objects():
        if issubclass(type(obj), _MultiProcessingDataLoaderIter) and not getattr(obj, "_shutdown", True):
            try:
                obj._shutdown_workers()  # PyTorch's own: tell, join, forget, and terminate a worker that hangs
            except Exception as e:  # noqa: BLE001 - the run has failed already; its line must stay the last
                logging.debug(f"shutting down a data loader's workers failed: {e!r}")
            stopped += 1
    return stopped

