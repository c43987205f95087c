"""Per-sample loss state split across ranks: the layout, re-sharding, and a digest that scales.

Rank ``r`` keeps id ``i`` of a ``(rows, num_samples)`` table at local column ``i // W`` when
``i mod W = r``, which spreads every shuffled batch evenly. `reshard` builds a shard from another
world size's, one source at a time. `state_digest` adds ``bits(x) * w(p) mod P`` over global
positions ``p``, exactly in int64 on the tensor's device: integer sums do not depend on the order,
so a sharded table digests as the replicated one, bit for bit, without a host copy.
"""

from __future__ import annotations

import hashlib
from typing import Callable, Dict, Iterable, Optional, Sequence, Tuple

import torch

#: modulus and weight multipliers of the digest sums
_P = 2**31 - 1
_MULTIPLIERS = (48271, 69621)
#: columns per chunk when digesting or re-sharding (bounds the temporaries)
CHUNK = 1 << 20

STATE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def shard_size(num_samples: int, rank: int, world_size: int) -> int:
    """Columns of rank ``rank``'s shard: the ids ``rank, rank + W, ...`` below ``num_samples``."""
    return max(0, (num_samples - rank + world_size - 1) // world_size)


def global_ids(
    num_samples: int, rank: int, world_size: int, start: int = 0, stop: Optional[int] = None, device=None
) -> torch.Tensor:
    """Global ids of local columns ``start:stop`` of rank ``rank``'s shard."""
    stop = shard_size(num_samples, rank, world_size) if stop is None else stop
    return rank + world_size * torch.arange(start, stop, dtype=torch.long, device=device)


def reshard(
    sources: Iterable[Tuple[int, int, Callable[[], torch.Tensor]]],
    num_samples: int,
    rank: int,
    world_size: int,
    out: torch.Tensor,
) -> torch.Tensor:
    """Fill ``out`` (rank ``rank``'s shard) from another layout's shards, one at a time.

    ``sources`` yields ``(source_rank, source_world_size, load)``; a replicated table is ``(0, 1, load)``.
    Raises ``ValueError`` for a shard of the wrong shape or sources that do not cover every column.
    """
    covered = 0
    for src_rank, src_world, load in sources:
        src = load()
        want = (out.shape[0], shard_size(num_samples, src_rank, src_world))
        if tuple(src.shape) != want:
            raise ValueError(
                f"shard {src_rank} of {src_world} has shape {tuple(src.shape)}; num_samples={num_samples} needs {want}"
            )
        if src_world == world_size and src_rank == rank:  # same layout: a straight copy
            out.copy_(src)
            covered += out.shape[1]
        else:
            for start in range(0, out.shape[1], CHUNK):
                ids = global_ids(num_samples, rank, world_size, start, min(out.shape[1], start + CHUNK))
                mine = ids % src_world == src_rank
                if bool(mine.any()):
                    cols = torch.arange(start, start + ids.numel())[mine]
                    out[:, cols.to(out.device)] = src[:, ids[mine] // src_world].to(out)
                    covered += int(mine.sum())
        del src
    if covered != out.shape[1]:
        raise ValueError(
            f"the source shards cover {covered} of the {out.shape[1]} columns of rank {rank} of "
            f"{world_size}: a shard is missing or repeated"
        )
    return out


def _bits(x: torch.Tensor) -> torch.Tensor:
    """The entries' bit patterns as int64 in ``[1, 2^32]`` (floats of any width, or integers)."""
    if x.is_floating_point() and x.element_size() <= 4:  # a mask, not a division: the common case
        width = torch.int32 if x.element_size() == 4 else torch.int16
        return (x.contiguous().view(width).to(torch.int64) & (2 ** (8 * x.element_size()) - 1)) + 1
    if x.is_floating_point():
        x = x.contiguous().view(torch.int64)
    return torch.remainder(x.to(torch.int64), _P) + 1


def _partial_sums(values: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """``(2,)`` int64: ``sum_p (bits_p + 1) * w_m(p) mod P``; each product fits in int64 before its remainder."""
    b = _bits(values.reshape(-1))
    pos = positions.reshape(-1).to(b.device)  # < 2^35, so pos * m < 2^52
    sums = [torch.remainder(b * torch.remainder(pos * m + 1, _P), _P).sum() for m in _MULTIPLIERS]
    return torch.remainder(torch.stack(sums), _P)


def table_sums(table: torch.Tensor, num_samples: int, rank: int = 0, world_size: int = 1) -> torch.Tensor:
    """Digest sums of one shard of a ``(rows, num_samples)`` table, at global positions ``row * N + id``."""
    total = torch.zeros(2, dtype=torch.long, device=table.device)
    for start in range(0, table.shape[1], CHUNK):
        stop = min(table.shape[1], start + CHUNK)
        ids = global_ids(num_samples, rank, world_size, start, stop, device=table.device)
        rows = torch.arange(table.shape[0], device=table.device)[:, None]
        total = torch.remainder(total + _partial_sums(table[:, start:stop], rows * num_samples + ids), _P)
    return total


def plain_sums(t: torch.Tensor) -> torch.Tensor:
    """Digest sums of a tensor that is not sharded (positions are its flat indices)."""
    if t.numel() == 0:
        return torch.zeros(2, dtype=torch.long, device=t.device)
    return _partial_sums(t, torch.arange(t.numel(), device=t.device))


def state_digest(entries: Sequence[Tuple[str, torch.dtype, Sequence[int], torch.Tensor]]) -> str:
    """sha256 over ``(name, dtype, global shape, sums)`` of each buffer, in name order (hex)."""
    h = hashlib.sha256()
    for name, dtype, shape, sums in sorted(entries, key=lambda e: e[0]):
        s = [int(v) for v in sums.cpu()]
        h.update(f"{name}:{dtype}:{tuple(int(n) for n in shape)}:{s[0]}:{s[1]};".encode())
    return h.hexdigest()


def digest_of_state_dict(state: Dict[str, torch.Tensor]) -> str:
    """The digest of a whole (unsharded) loss ``state_dict``, e.g. one read from a checkpoint."""
    return state_digest([(k, v.dtype, v.shape, plain_sums(v.detach())) for k, v in state.items()])
