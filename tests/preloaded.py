"""A preloaded interpreter for the end-to-end tests: ``python`` and ``clip-dcl`` commands that start in
milliseconds instead of the seconds that importing torch and OpenCLIP takes.

The tests that run documented commands, or a study's shell lines, through bash keep each command a
process of its own (its exit code, its stdout and stderr, its working folder and environment), since
that is what they check. What they need not pay each time is the interpreter's start-up. A server
(``python tests/preloaded.py serve SOCKET``) imports the third-party libraries once and forks per
command; a small client (the ``python`` and ``clip-dcl`` shims of :meth:`Preloaded.shims`) hands it
the command's arguments, folder, environment and standard streams, and exits with the command's code.

The forked worker behaves as ``python ...`` started afresh would, as far as a test can tell:

- the working folder, environment (``PYTHONPATH`` included: ``sys.path`` is rebuilt from it as a new
  interpreter builds it), arguments and standard streams are the client's;
- the project's own package is not preloaded, so it is imported from wherever that ``sys.path`` finds
  it (a command whose ``PYTHONPATH`` misses this checkout does not get this checkout's code);
- torch's thread count is the environment's ``OMP_NUM_THREADS``; ``random`` and numpy are reseeded;
- it ends as an interpreter ends (exit handlers, a traceback and code 1 for an exception).

Anything but ``[-u] -c CODE``, ``[-u] -m MODULE`` or ``[-u] SCRIPT`` (another flag, multiprocessing's spawn)
is passed to the real interpreter unchanged. The signals a test or launcher sends the command (TERM, INT,
HUP, USR1, USR2) are passed on to the worker. ``sys.executable`` of a worker is the ``python`` shim, so the commands a
command starts (a study's trainings) start preloaded too.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import sys

#: What the server imports before it forks: the libraries whose import is most of a command's start-up (a
#: command gets these from the server's own path, whatever its PYTHONPATH says).
PRELOAD = (
    "numpy",
    "PIL.Image",
    "torch",
    "torchvision",
    "open_clip",
    "open_clip_train.main",
    "open_clip_train.data",
    "webdataset",
)


def _send(conn: socket.socket, doc: dict, fds=()) -> None:
    body = json.dumps(doc).encode()
    socket.send_fds(conn, [struct.pack("!I", len(body)) + body], list(fds))


def _receive(conn: socket.socket):
    data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)
    if len(data) < 4:  # Preloaded.attach's probe: it connects and leaves
        raise ConnectionError("the client left before its request")
    (size,) = struct.unpack("!I", data[:4])
    body = data[4:]
    while len(body) < size:
        more = conn.recv(size - len(body))
        if not more:
            raise ConnectionError("the client left mid-request")
        body += more
    return json.loads(body), fds


# ------------------------------------------------------------------------------------------
# The client (stdlib only: it starts with `python -I -S`)
# ------------------------------------------------------------------------------------------
def client(path: str, real: str, args) -> int:
    """Run ``python ARGS`` through the server at ``path``; anything but ``-c``/``-m`` is exec'ed by ``real``."""
    import signal

    unbuffered = args[:1] == ["-u"]
    rest = args[1:] if unbuffered else args
    script = bool(rest) and not rest[0].startswith("-")
    if not script and not (len(rest) >= 2 and rest[0] in ("-c", "-m") and "multiprocessing" not in rest[1]):
        os.execv(real, [real, *args])
    if script:
        rest = ["", os.path.abspath(rest[0]), *rest[1:]]
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(path)
    _send(conn, {"args": list(rest), "unbuffered": unbuffered, "cwd": os.getcwd(), "env": dict(os.environ)}, [0, 1, 2])
    worker = _read_int(conn)
    if worker is None:
        return 1
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, lambda signum, _frame: os.kill(worker, signum))  # a signal to the command is the worker's
    code = _read_int(conn)
    return 1 if code is None else code


def _read_int(conn: socket.socket):
    got = b""
    while len(got) < 4:
        try:
            more = conn.recv(4 - len(got))
        except InterruptedError:
            continue
        if not more:
            sys.stderr.write("preloaded python: the server ended the command without its exit code\n")
            return None
        got += more
    return struct.unpack("!i", got)[0]


# ------------------------------------------------------------------------------------------
# The server
# ------------------------------------------------------------------------------------------
def serve(path: str, shim: str):
    """Preload, listen at ``path``, fork a handler per connection; return (in the worker only) its request."""
    import gc
    import importlib
    import signal

    try:  # the server ends with the test session that started it, however that ends (Linux: PR_SET_PDEATHSIG)
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)
    except (OSError, AttributeError):
        pass
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    here = os.path.dirname(os.path.abspath(__file__))
    own = set(filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep)))
    base = [p for p in sys.path[1:] if p not in own and p != here]
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    sock.listen(64)
    gc.freeze()  # the preloaded objects stay out of the workers' collections: fewer pages copied after a fork
    print("ready", flush=True)
    sys.stderr.flush()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # handlers are reaped by the kernel
    while True:
        conn, _ = sock.accept()
        if os.fork() != 0:
            conn.close()
            continue
        # the handler: read the request, fork the worker, report its exit code
        sock.close()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        try:
            request, fds = _receive(conn)
        except (OSError, ValueError, ConnectionError):
            os._exit(1)
        pid = os.fork()
        if pid == 0:
            conn.close()
            return request, fds, base, shim
        for fd in fds:
            os.close(fd)
        try:
            conn.sendall(struct.pack("!i", pid))
        except OSError:
            pass
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        try:
            conn.sendall(struct.pack("!i", code if code >= 0 else 128 - code))
        finally:
            os._exit(0)


def work(request: dict, fds, base, shim) -> None:
    """In the worker: become the client's ``python ARGS`` and run it (returns as a ``-c``/``-m`` run returns)."""
    import importlib
    import random
    import runpy
    import types

    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    flag, what, *rest = request["args"]
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    first = {"-c": "", "-m": os.getcwd()}.get(flag, os.path.dirname(os.path.realpath(what)))
    sys.path[:] = [first, *extra, *base]
    importlib.invalidate_caches()
    sys.executable = shim
    if request.get("unbuffered"):
        for stream in (sys.stdout, sys.stderr):
            stream.reconfigure(write_through=True)
    random.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    if "torch" in sys.modules:
        threads = os.environ.get("OMP_NUM_THREADS", "")
        sys.modules["torch"].set_num_threads(
            int(threads) if threads.isdigit() and int(threads) > 0 else os.cpu_count() or 1
        )
    try:
        if flag == "-m":
            sys.argv = [what, *rest]
            runpy.run_module(what, run_name="__main__", alter_sys=True)
        elif flag == "":  # a script
            sys.argv = [what, *rest]
            runpy.run_path(what, run_name="__main__")
        else:
            sys.argv = ["-c", *rest]
            main = types.ModuleType("__main__")
            sys.modules["__main__"] = main
            exec(compile(what, "<string>", "exec"), main.__dict__)
        code = 0
    except SystemExit as e:
        code = _exit_code(e.code)
    except BaseException:  # noqa: BLE001  (printed as the interpreter prints it)
        sys.excepthook(*sys.exc_info())
        code = 1
    _finish(code)


def _exit_code(value) -> int:
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    print(value, file=sys.stderr)
    return 1


def _finish(code: int) -> None:
    """End as an interpreter ends (non-daemon threads joined, exit handlers, streams flushed), without tearing
    down the modules: in a forked copy of the server that touches every page and takes seconds."""
    import atexit
    import threading

    threading._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


class Preloaded:
    """The server for one test module or session: ``with Preloaded(folder) as p: p.python, p.env(env)``.

    ``Preloaded(folder).start()`` starts it without waiting for it to be ready (the first command waits), and
    ``Preloaded.attach(socket)`` uses one that another process started in a short folder (pytest-xdist's workers
    share the controller's: each would otherwise import torch and OpenCLIP for a server of its own)."""

    def __init__(self, folder, socket_path=None) -> None:
        import tempfile

        self.folder = str(folder)
        self.python = os.path.join(self.folder, "bin", "python")
        # a socket's path has at most 107 bytes: it lives in a short folder of its own unless the folder is short
        short = len(os.path.join(self.folder, "python.sock")) < 100
        self.socket = socket_path or os.path.join(
            self.folder if short else tempfile.mkdtemp(prefix="preloaded-"), "python.sock"
        )
        self.proc = None

    @classmethod
    def attach(cls, socket_path, timeout: float = 120) -> "Preloaded":
        """The server another process started at ``socket_path`` (its folder's), once it accepts commands."""
        import time

        server = cls(os.path.dirname(socket_path), socket_path)
        deadline = time.monotonic() + timeout
        while True:
            try:
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                    probe.connect(server.socket)  # the server binds once it has imported what it preloads
                return server
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the preloaded python at {server.socket} did not start in {timeout} s")
                time.sleep(0.2)

    def start(self) -> "Preloaded":
        import subprocess

        os.makedirs(os.path.dirname(self.python), exist_ok=True)
        me = os.path.abspath(__file__)
        for name, fixed in (("python", ""), ("clip-dcl", "-m clip_dcl.cli ")):
            shim = os.path.join(self.folder, "bin", name)
            with open(shim, "w") as f:
                f.write(
                    f'#!/usr/bin/env bash\nexec "{sys.executable}" -I -S "{me}" client "{self.socket}" '
                    f'"{sys.executable}" {fixed}"$@"\n'
                )
            os.chmod(shim, 0o755)
        self.proc = subprocess.Popen(
            [sys.executable, me, "serve", self.socket, self.python],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
        )
        return self

    def __enter__(self) -> "Preloaded":
        self.start()
        if self.proc.stdout.readline().strip() != "ready":
            self.proc.kill()
            raise RuntimeError("the preloaded python did not start")
        return self

    def env(self, env: dict) -> dict:
        """``env`` with the shims first on its PATH."""
        return {**env, "PATH": os.pathsep.join([os.path.dirname(self.python), env.get("PATH", "")])}

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.proc.stdout.close()
        if os.path.exists(self.socket):
            os.unlink(self.socket)
        if os.path.dirname(self.socket) != self.folder:
            os.rmdir(os.path.dirname(self.socket))

    def __exit__(self, *exc) -> None:
        self.stop()


if __name__ == "__main__":
    if sys.argv[1] == "client":
        sys.exit(client(sys.argv[2], sys.argv[3], sys.argv[4:]))
    work(*serve(sys.argv[2], sys.argv[3]))
