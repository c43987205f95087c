"""DeCL's per-sample state split over ranks: layout, re-sharding, digests, checkpoint files, no spikes.

The losses here are built for a rank of a world without a process group (building one needs no
collective); the collectives themselves run in test_losses_distributed.py and
test_train_distributed.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import pytest
import torch

from clip_dcl.losses import create_loss
from clip_dcl.losses.state import digest_of_state_dict, reshard, shard_size, state_digest, table_sums
from clip_dcl.train import loss_state, saving

N = 23


def full_table(seed=0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    table = torch.randn(2, N, generator=gen).to(dtype)
    table[:, torch.randperm(N, generator=gen)[:5]] = float("nan")  # unvisited entries
    return table


def shard_of(table, rank, world):
    return table[:, rank::world]  # the reference layout: id i on rank i mod W, column i // W


def sharded_loss(rank, world, **kw):
    return create_loss("decl", rate="index", num_samples=N, rank=rank, world_size=world, **kw)


@pytest.mark.parametrize("world", [1, 2, 3, 5, 23, 30])
def test_shards_partition_the_ids(world):
    sizes = [shard_size(N, r, world) for r in range(world)]
    assert sum(sizes) == N and max(sizes) == -(-N // world)
    for r in range(world):
        loss = sharded_loss(r, world)
        assert tuple(loss.log_rate.shape) == (2, sizes[r] if world > 1 else N)


@pytest.mark.parametrize("src_world, dst_world", [(1, 2), (2, 1), (2, 3), (3, 2), (4, 4), (5, 1)])
def test_reshard_between_world_sizes_is_exact(src_world, dst_world):
    table = full_table()
    loaded = []
    sources = [
        (r, src_world, (lambda r=r: loaded.append(r) or shard_of(table, r, src_world).clone()))
        for r in range(src_world)
    ]
    for rank in range(dst_world):
        loaded.clear()
        out = torch.empty(2, shard_size(N, rank, dst_world))
        reshard(sources, N, rank, dst_world, out)
        assert torch.equal(out.nan_to_num(-9), shard_of(table, rank, dst_world).nan_to_num(-9))
        assert loaded == list(range(src_world))  # each source loaded once, in turn


def test_reshard_refuses_missing_or_misshapen_shards():
    table = full_table()
    out = torch.empty(2, shard_size(N, 0, 2))
    with pytest.raises(ValueError, match="cover"):
        reshard([(0, 3, lambda: shard_of(table, 0, 3))], N, 0, 2, out)
    with pytest.raises(ValueError, match=r"shape \(2, 3\)"):
        reshard([(0, 2, lambda: table[:, :3])], N, 0, 2, out)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_digest_sums_of_shards_add_up_to_the_whole(dtype):
    table = full_table(dtype=dtype)
    whole = table_sums(table, N)
    for world in (2, 3, 7):
        parts = sum(table_sums(shard_of(table, r, world).contiguous(), N, r, world) for r in range(world))
        assert torch.equal(torch.remainder(parts, 2**31 - 1), whole)


def test_digest_changes_with_any_entry_or_position():
    table = full_table()
    base = digest_of_state_dict({"log_rate": table})
    bumped = table.clone()
    bumped[1, 4] = torch.nextafter(bumped[1, 4], torch.tensor(float("inf")))  # one ulp
    swapped = table.clone()
    a, b = torch.isfinite(table[0]).nonzero().flatten()[:2].tolist()
    swapped[:, [a, b]] = swapped[:, [b, a]]
    assert digest_of_state_dict({"log_rate": bumped}) != base
    assert digest_of_state_dict({"log_rate": swapped}) != base
    assert digest_of_state_dict({"log_rate": table.clone()}) == base
    assert state_digest([("log_rate", table.dtype, table.shape, table_sums(table, N))]) == base


def test_a_sharded_loss_takes_its_columns_of_a_whole_table_and_names_a_wrong_size():
    table = full_table()
    state = {"calls": torch.tensor(4), "log_rate": table, "prev_log_rate": torch.tensor([0.5, -0.5])}
    for rank in range(3):
        loss = sharded_loss(rank, 3)
        loss.load_state_dict(dict(state))
        assert torch.equal(loss.log_rate.nan_to_num(-9), shard_of(table, rank, 3).nan_to_num(-9))
    wrong = create_loss("decl", rate="index", num_samples=N + 1, rank=1, world_size=3)
    with pytest.raises(ValueError, match=r"shape \(2, 23\).*num_samples=24 \(sharded, rank 1 of 3: 8 columns\)"):
        wrong.load_state_dict(dict(state))


def test_sixteen_bit_state_stores_in_sixteen_bits():
    for name, dtype in (("bfloat16", torch.bfloat16), ("float16", torch.float16)):
        loss = create_loss("decl", rate="index", num_samples=N, state_dtype=name)
        assert loss.log_rate.dtype == dtype and loss.prev_log_rate.dtype == torch.float32
        f = torch.nn.functional.normalize(torch.randn(6, 4), dim=-1)
        loss(f, f.flip(0), torch.tensor(5.0), sample_ids=torch.arange(6))
        assert loss.log_rate.dtype == dtype and torch.isfinite(loss.log_rate[:, :6].float()).all()
    with pytest.raises(ValueError, match="state_dtype='int8'"):
        create_loss("decl", rate="index", num_samples=N, state_dtype="int8")
    with pytest.raises(ValueError, match="state='everywhere'"):
        create_loss("decl", rate="index", num_samples=N, state="everywhere")


def args_for(tmp_path, epochs=3, save_frequency=1, **kw):
    return Namespace(
        logs=str(tmp_path),
        checkpoint_path=str(tmp_path / "checkpoints"),
        epochs=epochs,
        save_frequency=save_frequency,
        save_most_recent=kw.get("save_most_recent", False),
        delete_previous_checkpoint=kw.get("delete_previous_checkpoint", False),
    )


def write_run(tmp_path, table, world, epoch, **kw):
    """What every rank and the master write at the end of ``epoch`` (1-based), without torch.distributed."""
    args = args_for(tmp_path, **kw)
    folder = None
    for rank in range(world):
        loss = sharded_loss(rank, world)
        loss.log_rate.copy_(shard_of(table, rank, world))
        loss.calls.fill_(7)
        folder = loss_state.write_shards(loss, args, epoch)
    ckpt = Path(args.checkpoint_path) / f"epoch_{epoch}.pt"
    torch.save(
        {
            "epoch": epoch,
            "loss_state": saving.small_state(loss),
            "clip_dcl": {saving.SHARD_INDEX_KEY: saving.shard_index(loss, folder, args.checkpoint_path)},
        },
        ckpt,
    )
    return ckpt


@pytest.mark.parametrize("new_world, state", [(2, "sharded"), (3, "sharded"), (1, "sharded"), (2, "replicated")])
def test_checkpoint_shards_resume_on_any_world_size(tmp_path, new_world, state):
    table = full_table(1)
    ckpt = write_run(tmp_path, table, 2, 1)
    files = sorted(p.name for p in (tmp_path / "checkpoints").rglob("*") if p.is_file())
    assert files == ["epoch_1.pt", "log_rate.rank00000-of-00002.state", "log_rate.rank00001-of-00002.state"]
    assert not any(p.suffix == ".pt" for p in (tmp_path / "checkpoints" / "loss_state").rglob("*"))
    saved = torch.load(ckpt, weights_only=True)
    assert "log_rate" not in saved["loss_state"]  # the master's file holds no rates
    whole = saving.read_loss_state(ckpt)
    assert torch.equal(whole["log_rate"].nan_to_num(-9), table.nan_to_num(-9))
    for rank in range(new_world):
        loss = sharded_loss(rank, new_world, state=state)
        restored = loss_state.restore_sharded(
            loss, saved["loss_state"], saved["clip_dcl"][saving.SHARD_INDEX_KEY], str(ckpt)
        )
        loss.load_state_dict(restored)
        want = shard_of(table, rank, new_world) if loss.sharded else table
        assert torch.equal(loss.log_rate.nan_to_num(-9), want.nan_to_num(-9)) and int(loss.calls) == 7


def test_missing_shard_or_other_num_samples_is_named(tmp_path):
    ckpt = write_run(tmp_path, full_table(), 2, 1)
    saved = torch.load(ckpt, weights_only=True)
    index = saved["clip_dcl"][saving.SHARD_INDEX_KEY]
    other = create_loss("decl", rate="index", num_samples=N + 5)
    with pytest.raises(saving.LossStateFilesError, match=r"num_samples=23.*--decl-num-samples 28"):
        loss_state.restore_sharded(other, saved["loss_state"], index, str(ckpt))
    victim = next((tmp_path / "checkpoints").rglob("*rank00001*"))
    victim.unlink()
    with pytest.raises(saving.LossStateFilesError, match="rank00001-of-00002.state is missing"):
        loss_state.restore_sharded(sharded_loss(0, 2), saved["loss_state"], index, str(ckpt))


def test_shards_of_epochs_without_a_kept_checkpoint_are_pruned(tmp_path):
    table = full_table()
    for epoch in (1, 2, 3, 4):  # epoch_latest only, except the last epoch
        write_run(tmp_path, table, 2, epoch, epochs=4, save_frequency=0, save_most_recent=True)
    left = sorted(p.name for p in (tmp_path / "checkpoints" / "loss_state").iterdir())
    assert left == ["epoch_3", "epoch_4"]  # the previous epoch's stay until the next checkpoint is written
    args = args_for(tmp_path, epochs=4, save_frequency=0)
    assert not saving.checkpointed(args, 2) and saving.checkpointed(args, 4)


@pytest.mark.slow
def test_flag_validation_does_not_allocate_the_buffer(tmp_path):
    """400M samples would be a 3.2 GB buffer: validating the flags must not build it."""
    # the peak is VmHWM, the peak of this process's own memory map: getrusage's ru_maxrss also keeps the peak of
    # the map the process had before exec, which is the starting (pytest) process's, gigabytes of it
    code = (
        "import sys\n"
        "from clip_dcl.train import main\n"
        "from clip_dcl.train.flags import parse_train_args\n"
        "cfg = parse_train_args(['--loss', 'decl', '--decl-num-samples', '400000000', '--val-data', 'x.tar'], "
        "check_files=False)\n"
        "assert cfg.loss_kwargs['num_samples'] == 400000000\n"
        "rc = main(['--loss', 'decl', '--decl-num-samples', '400000000'])\n"
        "hwm = [line.split()[1] for line in open('/proc/self/status') if line.startswith('VmHWM:')][0]\n"
        "print('rss_kb', hwm)\n"
        "sys.exit(rc)\n"
    )
    # a fresh interpreter: its peak resident memory is the measurement
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )
    assert out.returncode == 2, out.stderr[-2000:]
    assert "nothing to train or evaluate: give --train-data" in out.stderr
    rss_gb = int(out.stdout.split("rss_kb")[1]) / 2**20
    # the buffer alone would add 3.2 GB to the interpreter's own (torch, OpenCLIP: about 1.5 GB)
    assert rss_gb < 2.5, f"peak resident memory {rss_gb:.2f} GB"
