#!/usr/bin/env bash
# Train on one machine with torchrun: one process per GPU, all flags passed through.
#
# Usage:
#   launch/train_single_node.sh [TRAINING FLAGS...]
#   NPROC=8 launch/train_single_node.sh --model RN50 --train-data '/data/cc3m/{00000..00331}.tar' \
#       --dataset-type webdataset --batch-size 128 --local-loss --gather-with-grad --loss decl
#
# The flags are those of `python -m clip_dcl.train --help` (OpenCLIP's plus --loss and its flags).
# torchrun's own `--logs-specs` option would swallow OpenCLIP's `--logs`, hence the `--` before them.
# torchrun runs as `python -m clip_dcl.train.torchrun` (torchrun's arguments): stopped by Ctrl-C it exits
# 130, by SIGTERM 75 (after the ranks saved their step), not torchrun's 1 and its traceback. It checks the
# training flags and the shards before any rank starts (and, on CUDA, NPROC against the GPUs this node sees),
# refusing in one line, and prints a failed rank's error line once.
#
# Variables (environment, default in brackets):
#   NPROC    processes on this node, one per GPU    [number of GPUs nvidia-smi lists, else 1]
#   PYTHON   Python that has clip-dcl installed      [python]
#   DRY_RUN  1: print the command instead of running it  [0]
set -euo pipefail

PYTHON="${PYTHON:-python}"
if [[ -z "${NPROC:-}" ]]; then
    NPROC=1
    if command -v nvidia-smi >/dev/null 2>&1; then
        gpus="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)"
        if [[ "${gpus:-0}" -gt 0 ]]; then NPROC="$gpus"; fi
    fi
fi

cmd=("$PYTHON" -m clip_dcl.train.torchrun --standalone --nnodes 1 --nproc_per_node "$NPROC"
     -m clip_dcl.train -- "$@")
if [[ "${DRY_RUN:-0}" == 1 ]]; then
    printf '%q ' "${cmd[@]}"; echo
else
    exec "${cmd[@]}"
fi
