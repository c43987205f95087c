"""The launch scripts: syntax, the commands they build (DRY_RUN=1), and the CC3M recipe's flags.

The recipe's training flags are fed to clip-dcl's own flag parser, so a recipe that OpenCLIP or
clip-dcl would reject fails here rather than on a cluster.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

LAUNCH = Path(__file__).resolve().parents[1] / "launch"
SCRIPTS = sorted(p for p in LAUNCH.iterdir() if p.suffix in (".sh", ".sbatch"))


def dry_run(script, *args, **env):
    full_env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("NPROC", "NNODES", "RDZV_HOST", "LOSS", "CC3M_TRAIN", "TRAIN_DATA", "SLURM_JOB_NODELIST")
    }
    full_env.update(DRY_RUN="1", PYTHON="python", **env)
    return subprocess.run(
        ["bash", str(LAUNCH / script), *args], capture_output=True, text=True, env=full_env, timeout=30
    )


def training_args(command_line: str):
    """The words after ``-m clip_dcl.train`` (and torchrun's ``--``)."""
    words = shlex.split(command_line.strip().splitlines()[-1])
    rest = words[words.index("clip_dcl.train") + 1 :]
    return rest[1:] if rest[:1] == ["--"] else rest


def test_there_are_the_four_launchers():
    names = {p.name for p in SCRIPTS}
    assert {"train_single_node.sh", "train_multi_node.sh", "train_slurm.sbatch", "cc3m_rn50x4.sh"} <= names


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_bash_syntax_and_documented_variables(script):
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    text = script.read_text()
    assert "Variables (environment, default in brackets):" in text
    # every ${VAR:-default} / ${VAR-default} / ${VAR:?} the script reads is documented in its header
    header = text.split("set -euo pipefail")[0]
    used = set(re.findall(r"\$\{([A-Z][A-Z0-9_]*)[:}-]", text)) - {
        "SLURM_JOB_NODELIST",
        "SLURM_SUBMIT_DIR",
        "BASH_SOURCE",
    }
    for var in used:
        assert re.search(rf"#\s+{var}\b", header) or f"{var}=" in header, (script.name, var)


def test_single_node_runs_torchrun_with_the_separator():
    out = dry_run("train_single_node.sh", "--logs", "/tmp/x", "--loss", "dcl", NPROC="4")
    assert out.returncode == 0, out.stderr
    words = shlex.split(out.stdout)
    assert words[:4] == ["python", "-m", "clip_dcl.train.torchrun", "--standalone"]  # torchrun, its exit codes ours
    assert words[words.index("--nproc_per_node") + 1] == "4"
    # the `--` keeps torchrun from reading OpenCLIP's --logs as its own --logs-specs
    assert words[words.index("clip_dcl.train") + 1 :] == ["--", "--logs", "/tmp/x", "--loss", "dcl"]


def test_multi_node_needs_a_rendezvous_host_and_passes_it():
    assert dry_run("train_multi_node.sh", "--loss", "clip").returncode == 2
    out = dry_run("train_multi_node.sh", "--loss", "clip", RDZV_HOST="node001", NNODES="3", NPROC="8", RDZV_ID="job7")
    assert out.returncode == 0, out.stderr
    words = shlex.split(out.stdout)
    for flag, value in (
        ("--nnodes", "3"),
        ("--nproc_per_node", "8"),
        ("--rdzv_backend", "c10d"),
        ("--rdzv_endpoint", "node001:29400"),
        ("--rdzv_id", "job7"),
    ):
        assert words[words.index(flag) + 1] == value
    assert training_args(out.stdout) == ["--loss", "clip"]


def test_slurm_runs_one_task_per_gpu_with_srun():
    out = dry_run("train_slurm.sbatch", "--loss", "decl", MASTER_PORT="1234")
    assert out.returncode == 0, out.stderr
    assert "MASTER_PORT=1234" in out.stdout
    assert shlex.split(out.stdout.splitlines()[-1])[0] == "srun"
    assert training_args(out.stdout) == ["--loss", "decl"]


@pytest.mark.parametrize("loss", ["clip", "dcl", "decl"])
@pytest.mark.parametrize("launcher", ["single", "multi", "slurm"])
def test_cc3m_recipe_is_the_papers_openclip_run_and_parses(loss, launcher):
    from open_clip_train.params import parse_args

    from clip_dcl.train.flags import parse_train_args

    out = dry_run(
        "cc3m_rn50x4.sh", "--workers", "4", LOSS=loss, CC3M_TRAIN="/data/cc3m", LAUNCHER=launcher, RDZV_HOST="node001"
    )
    assert out.returncode == 0, out.stderr
    cfg = parse_train_args(training_args(out.stdout), check_files=False)  # clip-dcl's validation, no files touched
    assert cfg.loss == loss
    args = parse_args(cfg.openclip_argv)
    assert args.model == "RN50x4" and args.epochs == 30
    assert (args.lr, args.wd, args.batch_size, args.warmup) == (1e-3, 0.1, 128, 10000)
    assert args.local_loss and args.gather_with_grad
    assert args.train_data == "/data/cc3m/{00000..00331}.tar"
    assert args.workers == 4  # extra flags override the recipe's
    if loss == "decl":
        assert cfg.loss_args["rate"] == "index"
        assert cfg.num_samples == 332 * 10_000  # img2dataset keys reach shard * 10^4 + 9999
    if loss == "dcl":  # no TAU_PLUS: the package default, not a prior of the recipe's
        assert cfg.loss_args["tau_plus"] == 0.0 and "--tau-plus" not in out.stdout


def test_cc3m_recipe_passes_tau_plus_to_dcl_and_says_where_dcl_is_infonce():
    from clip_dcl.train.flags import parse_train_args

    out = dry_run("cc3m_rn50x4.sh", LOSS="dcl", TAU_PLUS="0.05", CC3M_TRAIN="/data/cc3m")
    assert parse_train_args(training_args(out.stdout), check_files=False).loss_args["tau_plus"] == 0.05
    header = (LAUNCH / "cc3m_rn50x4.sh").read_text().split("\nset -euo")[0]
    # Table 5 is clip and decl; dcl without TAU_PLUS is named for what it trains
    assert "for loss in clip decl;" in header and "for loss in clip dcl decl" not in header
    assert "Without TAU_PLUS it passes no prior" in header and "InfoNCE exactly" in header


def test_cc3m_recipe_rejects_an_unknown_loss_and_missing_data():
    assert dry_run("cc3m_rn50x4.sh", LOSS="simclr", CC3M_TRAIN="/d").returncode == 2
    assert "CC3M_TRAIN" in dry_run("cc3m_rn50x4.sh", LOSS="dcl").stderr
