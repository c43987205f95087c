#!/usr/bin/env bash
# Train on several machines with torchrun: run this same command on every node.
#
# Usage (on each of the NNODES nodes):
#   NNODES=4 NPROC=8 RDZV_HOST=node001 RDZV_ID=cc3m-decl \
#       launch/train_multi_node.sh --model RN50x4 --train-data '/data/cc3m/{00000..00331}.tar' ... --loss decl
#
# Rendezvous: torchrun's c10d rendezvous (--rdzv_backend c10d) on RDZV_HOST:RDZV_PORT, which must be
# reachable from every node (the first node is a good choice; no separate server is needed). Ranks are
# assigned when all NNODES nodes have joined, so no node rank has to be given; every node must use the
# same RDZV_ID. OpenCLIP picks nccl on GPUs and gloo on CPUs. The data must be readable from every node;
# each rank reads its own shards (--train-data), so there must be at least workers x ranks shards.
# torchrun runs as `python -m clip_dcl.train.torchrun` (torchrun's arguments): stopped by Ctrl-C it exits
# 130, by SIGTERM 75 (after the ranks saved their step), not torchrun's 1 and its traceback. It checks the
# training flags and the shards before any rank starts (and, on CUDA, NPROC against the GPUs this node sees),
# refusing in one line, and prints a failed rank's error line once.
#
# Variables (environment, default in brackets):
#   NNODES     number of nodes                                   [2]
#   NPROC      processes per node, one per GPU                   [number of GPUs nvidia-smi lists, else 1]
#   RDZV_HOST  host name or address of the rendezvous (required)
#   RDZV_PORT  its TCP port                                      [29400]
#   RDZV_ID    job id shared by all nodes of one run             [clip-dcl]
#   PYTHON     Python that has clip-dcl installed                [python]
#   DRY_RUN    1: print the command instead of running it        [0]
set -euo pipefail

PYTHON="${PYTHON:-python}"
NNODES="${NNODES:-2}"
RDZV_PORT="${RDZV_PORT:-29400}"
RDZV_ID="${RDZV_ID:-clip-dcl}"
if [[ -z "${RDZV_HOST:-}" ]]; then
    echo "train_multi_node.sh: set RDZV_HOST to the host name of the rendezvous node (e.g. the first node)" >&2
    exit 2
fi
if [[ -z "${NPROC:-}" ]]; then
    NPROC=1
    if command -v nvidia-smi >/dev/null 2>&1; then
        gpus="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)"
        if [[ "${gpus:-0}" -gt 0 ]]; then NPROC="$gpus"; fi
    fi
fi

cmd=("$PYTHON" -m clip_dcl.train.torchrun --nnodes "$NNODES" --nproc_per_node "$NPROC"
     --rdzv_id "$RDZV_ID" --rdzv_backend c10d --rdzv_endpoint "$RDZV_HOST:$RDZV_PORT"
     -m clip_dcl.train -- "$@")
if [[ "${DRY_RUN:-0}" == 1 ]]; then
    printf '%q ' "${cmd[@]}"; echo
else
    exec "${cmd[@]}"
fi
