"""The preloaded python of the end-to-end tests (tests/preloaded.py) runs a command as a fresh interpreter would:
its folder, environment, ``PYTHONPATH``, streams, exit code and signals are the command's."""

from __future__ import annotations

import os
import subprocess
import sys


def sh(preloaded, script, cwd, **env):
    return subprocess.run(
        ["bash", "-c", script],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env=preloaded.env({**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, **env}),
    )


def test_a_command_gets_its_folder_environment_arguments_and_exit_code(preloaded, tmp_path):
    got = sh(
        preloaded,
        "echo in | python -c \"import os, sys; print(os.getcwd(), os.environ['X'], sys.argv[1:], "
        'sys.stdin.read().strip(), sys.executable); sys.exit(3)" a b; echo "rc=$?"',
        tmp_path,
        X="x",
    )
    assert got.stdout.split() == [str(tmp_path), "x", "['a',", "'b']", "in", preloaded.python, "rc=3"], got.stderr


def test_an_exception_is_a_traceback_and_exit_code_1(preloaded, tmp_path):
    got = sh(preloaded, "python -c \"raise ValueError('bad')\"", tmp_path)
    assert got.returncode == 1 and got.stderr.strip().endswith("ValueError: bad")


def test_modules_come_from_the_commands_pythonpath(preloaded, tmp_path):
    """The project's package is not preloaded: a command imports the one its PYTHONPATH names."""
    (tmp_path / "lib" / "clip_dcl").mkdir(parents=True)
    (tmp_path / "lib" / "clip_dcl" / "__init__.py").write_text("WHERE = 'lib'\n")
    (tmp_path / "lib" / "clip_dcl" / "__main__.py").write_text("print('main of lib')\n")
    got = sh(
        preloaded,
        'python -c "import clip_dcl; print(clip_dcl.WHERE)"; python -m clip_dcl',
        tmp_path,
        PYTHONPATH=str(tmp_path / "lib"),
    )
    assert got.stdout.split("\n")[:2] == ["lib", "main of lib"], got.stderr
    got = sh(preloaded, "python -c \"import clip_dcl; print(getattr(clip_dcl, 'WHERE', 'elsewhere'))\"", tmp_path)
    assert got.stdout.strip() == "elsewhere", got.stderr


def test_torch_threads_follow_omp_num_threads(preloaded, tmp_path):
    got = sh(preloaded, 'python -c "import torch; print(torch.get_num_threads())"', tmp_path, OMP_NUM_THREADS="1")
    assert got.stdout.strip() == "1", got.stderr


def test_a_signal_to_the_command_reaches_it(preloaded, tmp_path):
    script = (
        'python -c "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(75)); '
        'print(1, flush=True); time.sleep(60)" > out & pid=$!; '
        'until test -s out; do sleep 0.1; done; kill -TERM $pid; wait $pid; echo "rc=$?"'
    )
    assert sh(preloaded, script, tmp_path).stdout.strip() == "rc=75"


def test_other_forms_run_the_real_interpreter(preloaded, tmp_path):
    got = sh(preloaded, "python -V", tmp_path)
    assert got.returncode == 0 and got.stdout.strip() == f"Python {sys.version.split()[0]}"
