"""A failed run exits, a diverged run stops, and evaluation refuses a model that is not finite.

``hang``: every way a run can fail with a data-loader worker alive (``--workers 1``, the default
preemption signals) ends the process within a bound: an error in the loss, a full disk at a save,
Ctrl-C, a rank that died, a rank that hangs. Each launch runs in a subprocess with a timeout, so a
regression fails the test instead of hanging the suite.

``diverge``: a run whose loss or weights turn NaN stops with exit code 1, names the first bad step,
and writes no checkpoint of the NaN weights, so the last finite one stays the newest.

``nonfinite_eval``: every evaluation task exits 2 with one line on a NaN checkpoint.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import train_in_process
from test_train_distributed import write_shards

HERE = Path(__file__).resolve().parent
HELPER = HERE / "distributed" / "preempt_train.py"
#: Seconds a launch may take before the test fails: a tiny run takes about 10 on a loaded CPU; the
#: hangs this module guards against never ended.
BOUND = 90


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return write_shards(tmp_path_factory.mktemp("shards"), num_shards=4, per_shard=16)


def _env(**extra):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", **extra}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE.parent), os.environ.get("PYTHONPATH")) if p)
    return env


def _flags(pattern, logs, name, *extra):
    return [
        "--model",
        "clip-dcl-tiny",
        "--train-data",
        pattern,
        "--dataset-type",
        "webdataset",
        "--dataset-resampled",
        "--train-num-samples",
        "64",
        "--batch-size",
        "8",
        "--workers",
        "1",
        "--epochs",
        "2",
        "--precision",
        "fp32",
        "--device",
        "cpu",
        "--seed",
        "0",
        "--lr",
        "1e-3",
        "--warmup",
        "1",
        "--log-every-n-steps",
        "1",
        "--report-to",
        "",
        "--logs",
        str(logs),
        "--name",
        name,
        *extra,
    ]


def _default_sigint():
    """In the child before it starts: SIGINT at its default, as in a terminal. A suite started in the background
    (``make test &``) inherits SIGINT ignored, and Python then installs no Ctrl-C handler of its own."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _launch(args, env=None, python=None):
    """Start ``python ARGS`` (this interpreter, or the ``python`` given: the preloaded one); return the process
    and its start time."""
    return subprocess.Popen(
        [python or sys.executable, *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env or _env(),
        start_new_session=True,
        preexec_fn=_default_sigint,
    ), time.monotonic()


def _finish(proc, timeout=BOUND):
    """``(returncode, stderr, seconds)``; the process group is killed when it outlives ``timeout``."""
    start = time.monotonic()
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the run and its data-loader workers
        _, err = proc.communicate()
        pytest.fail(f"the run was still running after {timeout} s:\n{err[-3000:]}")
    return proc.returncode, err, time.monotonic() - start


# -- the worker: its parent's SIGTERM ends it, anyone else's does not -------------------------------------
def _worker(ready):
    from clip_dcl.train.signals import worker_ignores_stop_signals

    worker_ignores_stop_signals(0)  # what a training data-loader worker runs first
    ready.set()
    while True:
        time.sleep(0.1)


@pytest.mark.skipif(not hasattr(signal, "sigwaitinfo"), reason="POSIX only")
def test_hang_a_worker_ends_on_its_parents_sigterm_and_ignores_anyone_elses():
    import multiprocessing

    from clip_dcl.train.signals import StopSignals

    signals = StopSignals(["SIGTERM"]).install()  # the trainer's handlers, inherited by the forked worker
    ctx = multiprocessing.get_context("fork")
    ready = ctx.Event()
    worker = ctx.Process(target=_worker, args=(ready,), daemon=True)
    try:
        worker.start()
        assert ready.wait(30)
        # a scheduler's SIGTERM (from another process): the worker goes on, the trainer decides when to stop
        subprocess.run(["kill", "-TERM", str(worker.pid)], check=True)
        worker.join(1)
        assert worker.is_alive()
        # its parent's (multiprocessing's terminate at exit, PyTorch's loader shutdown): the worker ends
        worker.terminate()
        worker.join(10)
        assert not worker.is_alive(), "the worker ignored its parent's SIGTERM: the exit-time join would hang"
        assert worker.exitcode == 128 + signal.SIGTERM
    finally:
        if worker.is_alive():
            worker.kill()
        signals.restore()


def test_hang_ctrl_c_stops_at_the_next_step_while_training_and_at_once_otherwise():
    from clip_dcl.train.signals import StopSignals

    before = signal.getsignal(signal.SIGINT)
    signals = StopSignals(["SIGTERM"], ctrl_c=True).install()
    signals.training_started()  # before the first step: test_reliability_startup
    try:
        with pytest.raises(KeyboardInterrupt):  # not training: evaluating, saving
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
        signals.armed = True
        os.kill(os.getpid(), signal.SIGINT)  # training: a flag, the step boundary saves and stops
        assert signals.received == "SIGINT"
        with pytest.raises(KeyboardInterrupt):  # the second: at once
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
    finally:
        signals.restore()
    assert signal.getsignal(signal.SIGINT) is before


# -- end to end: each way a run fails, with a worker alive ----------------------------------------------
@pytest.mark.slow
def test_hang_an_error_in_the_loss_with_a_worker_exits(shards, tmp_path, preloaded):
    # keys up to 63 and a buffer of 8 ids: the loss raises on the first step (the run starts from the preloaded
    # python: the error comes from within, after start-up)
    proc, _ = _launch(
        [
            "-m",
            "clip_dcl.train",
            *_flags(shards, tmp_path / "logs", "ids", "--loss", "decl", "--decl-num-samples", "8"),
        ],
        python=preloaded.python,
    )
    rc, err, took = _finish(proc)
    assert rc == 1, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert "clip-dcl train: error: " in last and "--decl-num-samples" in last, err[-3000:]  # no traceback after it
    assert took < BOUND


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_hang_a_full_disk_at_a_save_with_a_worker_exits(shards, tmp_path, preloaded):
    folder = tmp_path / "logs" / "full" / "checkpoints"
    folder.mkdir(parents=True)
    (folder / "epoch_1.pt.partial").symlink_to("/dev/full")  # every write to it fails with ENOSPC
    proc, _ = _launch(
        ["-m", "clip_dcl.train", *_flags(shards, tmp_path / "logs", "full", "--loss", "dcl")], python=preloaded.python
    )
    rc, err, _ = _finish(proc)
    assert rc == 1, err[-3000:]
    assert f"cannot write checkpoint {folder / 'epoch_1.pt'}: the disk is full" in err
    assert "clip-dcl train: error: cannot write checkpoint" in err.strip().splitlines()[-1]  # the last line


@pytest.mark.slow
@pytest.mark.parametrize("preempt", [[], ["--preempt-signals", "none"]], ids=["default", "no-handlers"])
def test_hang_ctrl_c_with_a_worker_exits_and_saves_when_it_is_safe(shards, tmp_path, preempt):
    # SIGINT from another process to the run and its worker after its 3rd step, as a terminal's Ctrl-C
    env = _env(PREEMPT_AT_STEP="3", PREEMPT_SIGNAL="SIGINT")
    proc, _ = _launch([HELPER, *_flags(shards, tmp_path / "logs", "int", "--loss", "dcl", *preempt)], env=env)
    rc, err, _ = _finish(proc)
    assert rc == 130, err[-3000:]
    saved = sorted(p.name for p in (tmp_path / "logs" / "int" / "checkpoints").glob("*.pt")) if not preempt else []
    if not preempt:  # the handler: the step finishes, a checkpoint is saved at it
        assert saved == ["epoch_0_step_3.pt"], err[-3000:]
        assert "Stopped on SIGINT after step 3 of epoch 0" in err
    else:  # Python's own KeyboardInterrupt, at once
        assert "interrupted (Ctrl-C)" in err


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _two_ranks(shards, tmp_path, fault, *extra, python=None):
    """Rank 0 and rank 1 started by hand (no torchrun to kill the survivor); rank 1 sends ``fault`` to itself
    and its worker after its 3rd step. Rank 0, whom no signal reaches, starts from ``python`` (the preloaded
    one); rank 1 is a process of its own. Returns (rank 0's rc, stderr, seconds), rank 1's process."""
    port = str(_free_port())
    procs = []
    for rank in (0, 1):
        env = _env(
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE="2",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=port,
            PREEMPT_AT_STEP="3",
            PREEMPT_RANK="1",
            PREEMPT_SIGNAL=fault,
        )
        procs.append(
            _launch(
                [
                    HELPER,
                    *_flags(
                        shards,
                        tmp_path / "logs",
                        "peer",
                        "--loss",
                        "dcl",
                        "--local-loss",
                        "--gather-with-grad",
                        "--epochs",
                        "3",
                        *extra,
                    ),
                ],
                env=env,
                python=python if rank == 0 else None,
            )[0]
        )
    try:
        return _finish(procs[0]), procs[1]
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()


@pytest.mark.slow
def test_hang_a_dead_peer_ends_the_other_rank_with_a_line_naming_it(shards, tmp_path, preloaded):
    (rc, err, _), peer = _two_ranks(shards, tmp_path, "SIGKILL", python=preloaded.python)
    assert peer.returncode == -signal.SIGKILL
    assert rc == 1, err[-3000:]
    # gloo's own words vary ("Connection reset by peer", "[...] Connection closed by peer")
    assert "rank 0: a collective with the other ranks failed, so this rank stops: RuntimeError: " in err
    assert "by peer" in err.split("so this rank stops:")[1]


@pytest.mark.slow
def test_hang_a_hung_peer_ends_the_other_rank_after_dist_timeout(shards, tmp_path):
    # both ranks fresh interpreters: --dist-timeout also bounds the rendezvous, and a preloaded rank 0 would wait
    # there for rank 1's start-up longer than 5 s on a loaded machine
    (rc, err, took), _ = _two_ranks(shards, tmp_path, "SIGSTOP", "--dist-timeout", "5")
    assert rc == 1, err[-3000:]
    assert "rank 0: a collective with the other ranks failed" in err and "Timed out" in err


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--max-nonfinite-steps", "-1"], "--max-nonfinite-steps must be >= 0 (0: never stop), got -1"),
        (["--dist-timeout", "0"], "--dist-timeout must be a number of seconds > 0, got 0"),
        (["--dist-timeout", "nan"], "--dist-timeout must be a number of seconds > 0, got nan"),
    ],
)
def test_hang_and_diverge_flags_with_bad_values_exit_2_naming_them(capsys, flags, named):
    from clip_dcl.train import main

    assert main(["--dataset-type", "synthetic", "--train-num-samples", "8", *flags]) == 2
    assert named in capsys.readouterr().err


def test_hang_dist_timeout_reaches_init_process_group(monkeypatch):
    import datetime

    from clip_dcl.train.compat import init_process_group_timeout

    calls = []
    monkeypatch.setattr(torch.distributed, "init_process_group", lambda *a, **kw: calls.append(kw))
    fake = torch.distributed.init_process_group
    with init_process_group_timeout(7.5):
        torch.distributed.init_process_group(backend="gloo", init_method="env://")
    assert torch.distributed.init_process_group is fake  # restored once the set-up returns
    with init_process_group_timeout(None):
        torch.distributed.init_process_group(backend="gloo")
    assert calls == [
        {"backend": "gloo", "init_method": "env://", "timeout": datetime.timedelta(seconds=7.5)},
        {"backend": "gloo"},
    ]


# -- divergence -------------------------------------------------------------------------------------------
def test_diverge_count_trips_after_n_nonfinite_steps_in_a_row():
    from clip_dcl.train.divergence import NonFiniteSteps

    nan, one = torch.tensor(float("nan")), torch.tensor(1.0)
    count = NonFiniteSteps(3, "cpu")
    for step, loss in enumerate([one, nan, nan, one, nan, {"a": one, "b": torch.tensor(float("inf"))}, nan]):
        count.record({"contrastive_loss": loss} if isinstance(loss, torch.Tensor) else loss)
        count.end_step(step)
        assert count.tripped() == (step == 6), step  # a finite step in between starts the count again
    assert count.first() == 1 and count.where(4) == "step 0 of epoch 1"  # the run of 3 began at global step 4
    never = NonFiniteSteps(0, "cpu")
    for step in range(5):
        never.record(nan)
        never.end_step(step)
    assert not never.tripped() and never.first() == 0


def test_diverge_count_makes_no_tensor_of_host_values_at_a_step_end():
    """A tensor made of a Python value on a GPU is a host-to-device copy that waits for the device: the count keeps
    the step boundary free of it (its steps' values are combined on the device)."""
    from torch.overrides import TorchFunctionMode

    from clip_dcl.train.divergence import NonFiniteSteps

    class Made(TorchFunctionMode):
        calls = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            Made.calls += func in (torch.tensor, torch.as_tensor, torch.full, torch.scalar_tensor)
            return func(*args, **(kwargs or {}))

    count = NonFiniteSteps(2, "cpu")
    loss = torch.tensor(float("nan"))
    with Made():
        for step in range(3):
            count.record(loss)
            count.end_step(step)
    assert Made.calls == 0 and count.tripped() and count.where(10) == "step 0 of epoch 0"


def _synthetic(logs, name, *extra):
    return [
        "--model",
        "clip-dcl-tiny",
        "--dataset-type",
        "synthetic",
        "--train-num-samples",
        "64",
        "--batch-size",
        "8",
        "--epochs",
        "3",
        "--workers",
        "1",
        "--precision",
        "fp32",
        "--device",
        "cpu",
        "--seed",
        "0",
        "--lr",
        "1e-3",
        "--warmup",
        "1",
        "--report-to",
        "",
        "--logs",
        str(logs),
        "--name",
        name,
        "--loss",
        "dcl",
        *extra,
    ]


@pytest.mark.slow
def test_diverge_nan_weight_decay_is_refused_before_any_work(tmp_path):
    res = train_in_process(_synthetic(tmp_path, "wd", "--wd", "nan"))
    assert res.returncode == 2 and "--wd nan: must be a finite number >= 0" in res.stderr
    assert not (tmp_path / "logs").exists() or not list(tmp_path.glob("**/*.pt"))


def test_diverge_nan_weights_stop_at_the_first_epoch_end_without_a_checkpoint(tmp_path, nan_after_step):
    nan_after_step(1)  # every weight NaN after the first step (step 0): the loss is NaN from step 1 on
    res = train_in_process(_synthetic(tmp_path, "wd"))
    assert res.returncode == 1
    # 8 steps an epoch, fewer than --max-nonfinite-steps 10: the weights at the epoch end stop it
    assert (
        "training diverged: after epoch 0, " in res.stderr
        and "weight tensor(s) hold NaN or inf" in res.stderr
        and "the loss was first NaN or inf at step 1 of epoch 0" in res.stderr
    ), res.stderr[-3000:]
    assert "Train Epoch: 1" not in res.stderr
    assert not list(tmp_path.glob("**/*.pt"))


@pytest.fixture
def nan_after_step():
    """``nan_after_step(k)``: every parameter the optimizer steps becomes NaN after its k-th step."""
    from torch.optim.optimizer import register_optimizer_step_post_hook

    handles = []

    def arm(k):
        steps = [0]

        def hook(optimizer, args, kwargs):
            steps[0] += 1
            if steps[0] == k:
                with torch.no_grad():
                    for group in optimizer.param_groups:
                        for p in group["params"]:
                            p.fill_(float("nan"))

        handles.append(register_optimizer_step_post_hook(hook))

    yield arm
    for h in handles:
        h.remove()


@pytest.mark.slow
def test_diverge_mid_run_stops_naming_the_step_and_keeps_the_last_finite_checkpoint(tmp_path, nan_after_step):
    from clip_dcl.checkpoint import load_checkpoint

    nan_after_step(10)  # 8 steps an epoch: after step 1 of epoch 1; the loss of steps 2 and 3 is NaN
    res = train_in_process(_synthetic(tmp_path, "mid", "--max-nonfinite-steps", "2", "--log-every-n-steps", "1"))
    folder = tmp_path / "mid" / "checkpoints"
    assert res.returncode == 1, res.stderr[-3000:]
    assert (
        "training diverged: the loss was NaN or inf for 2 optimizer steps in a row (--max-nonfinite-steps 2), "
        "from step 2 of epoch 1; no checkpoint of these weights was written; the newest, "
        f"{folder / 'epoch_1.pt'}, is what the same command with --resume latest resumes"
    ) in res.stderr, res.stderr[-3000:]
    assert "Train Epoch: 1 [32/64" in res.stderr and "Train Epoch: 1 [40/64" not in res.stderr  # after step 3
    assert sorted(p.name for p in folder.glob("*.pt")) == ["epoch_1.pt"]
    model, _, _ = load_checkpoint(folder / "epoch_1.pt")
    assert all(torch.isfinite(p).all() for p in model.parameters())


@pytest.mark.slow
def test_diverge_a_mid_epoch_save_of_nan_weights_is_refused_and_the_previous_one_kept(tmp_path, nan_after_step):
    nan_after_step(2)
    # a save at every step boundary: step 1's is finite, step 2's would be NaN
    res = train_in_process(_synthetic(tmp_path, "step", "--save-every-minutes", "1e-9"))
    assert res.returncode == 1, res.stderr[-3000:]
    assert (
        "training diverged: not writing the checkpoint of step 2 of epoch 0: " in res.stderr
        and "weight tensor(s) hold NaN or inf" in res.stderr
    ), res.stderr[-3000:]
    assert sorted(p.name for p in (tmp_path / "step" / "checkpoints").glob("*.pt")) == ["epoch_0_step_1.pt"]


def test_diverge_no_checkpoint_of_nan_weights_is_written(tmp_path):
    from clip_dcl.train.divergence import Diverged
    from clip_dcl.train.flags import TrainConfig
    from clip_dcl.train.run import TrainingRun

    run = TrainingRun(TrainConfig("clip", {}, {}))
    run.loss = torch.nn.Identity()
    run.model = torch.nn.Linear(2, 2)
    # a buffer may hold inf on purpose (a causal attention mask): only the parameters are checked
    run.model.register_buffer("attn_mask", torch.full((2, 2), float("-inf")))
    with torch.no_grad():
        run.model.bias[1] = float("nan")
    path = tmp_path / "epoch_2.pt"
    with pytest.raises(Diverged, match=r"not writing .*epoch_2.pt: 1 weight tensor\(s\) hold NaN or inf \(bias\)"):
        run.save({"epoch": 2, "name": "x", "state_dict": run.model.state_dict(), "optimizer": {}}, str(path))
    assert not list(tmp_path.iterdir())


# -- evaluation of a NaN model ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def nan_eval(tmp_path_factory):
    """A clip-dcl-tiny checkpoint whose weights are NaN, and the quick synthetic evaluation sets."""
    import open_clip

    from clip_dcl.data.synth import generate
    from clip_dcl.models import register_builtin_configs

    root = tmp_path_factory.mktemp("nan_eval")
    summary = generate(root / "synth", quick=True, verbose=False)
    register_builtin_configs()
    model = open_clip.create_model("clip-dcl-tiny")
    state = {k: torch.full_like(v, float("nan")) if v.is_floating_point() else v for k, v in model.state_dict().items()}
    torch.save({"epoch": 1, "state_dict": state, "clip_dcl": {"model": "clip-dcl-tiny"}}, root / "nan.pt")
    return root, Path(summary["out_dir"])


@pytest.mark.parametrize(
    "task, data, what",
    [
        ("zeroshot", ["--data", "zeroshot"], "class prompts (the zero-shot classifier)"),
        ("retrieval", ["--data", "val"], "retrieval images"),
        (
            "fewshot",
            ["--data", "fewshot", "--datasets", "synth-shape", "--seeds", "0", "--grid", "reduced"],
            "synth-shape train",
        ),
    ],
)
def test_nonfinite_eval_every_task_exits_2_with_one_line(nan_eval, capsys, task, data, what):
    from clip_dcl.eval.cli import main

    root, synth = nan_eval
    data = [synth / d if i == 1 else d for i, d in enumerate(data)]
    rc = main([task, *map(str, data), "--checkpoint", str(root / "nan.pt"), "--device", "cpu", "--no-progress"])
    err = capsys.readouterr()
    assert rc == 2
    line = err.err.strip()
    assert "\n" not in line and line.startswith(
        f"clip-dcl eval {task}: the model's features of the {what} hold NaN or inf ("
    )
    assert "weight tensors (" in line and "nothing is scored" in line
    assert "acc1" not in err.out and "nan" not in err.out.lower()


def test_nonfinite_eval_benchmark_exits_2(nan_eval, tmp_path, capsys):
    from test_eval_benchmark_layout import _classification_set

    from clip_dcl.eval.cli import main

    root, _ = nan_eval
    _classification_set(tmp_path / "wds_toy_colours")
    rc = main(
        [
            "benchmark",
            "--dataset",
            "wds/toy_colours",
            "--dataset_root",
            str(tmp_path / "wds_{dataset_cleaned}"),
            "--model",
            "clip-dcl-tiny",
            "--pretrained",
            str(root / "nan.pt"),
            "--num_workers",
            "0",
            "--no_amp",
            "--output",
            str(tmp_path / "out" / "{dataset}.json"),
            "--quiet",
        ]
    )
    assert rc == 2
    assert "clip-dcl eval benchmark: the model's features of the" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_nonfinite_eval_check_counts_rows_and_passes_finite_features():
    from clip_dcl.eval.encoding import NonFiniteFeatures, finite_features

    model = torch.nn.Linear(2, 2)
    ok = torch.randn(4, 3)
    assert finite_features(ok, model, "images") is ok
    bad = ok.clone()
    bad[1, 2], bad[3, 0] = float("nan"), float("-inf")
    with pytest.raises(NonFiniteFeatures, match=r"features of the images hold NaN or inf \(2 of 4 rows\): nothing"):
        finite_features(bad, model, "images")
    with torch.no_grad():
        model.bias[0] = float("nan")
    with pytest.raises(ValueError, match=r"and so do 1 of its weight tensors \(bias; a training that diverged\)"):
        finite_features(bad, model, "images")
