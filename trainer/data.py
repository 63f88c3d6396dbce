"""Deterministic training data: a synthetic stream, or a directory of token shards.

Shards are `*.bin` files of raw little-endian uint16 tokens (nanoGPT's format).
Files are sorted by name and rank r takes shards[r::world_size]; each rank reads
only its own. A rank whose shards run out stops yielding batches and the training
loop leaves early - exactly the field case "one node had 201 shards, the other
4": that rank leaves while its peers wait in all-reduce for ever. The data
fingerprint makes such a run visible before it hangs.
"""
from __future__ import annotations

import array
import hashlib
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import torch

TOKEN_BYTES = 2  # uint16
NOISE = 0.1      # fraction of synthetic tokens replaced by random ones


@dataclass(frozen=True)
class DataPlan:
    """What this rank will read, decided before training starts."""
    description: str
    fingerprint: str
    batches: int          # batches per epoch on this rank, -1 for an endless stream
    shards: int           # shards this rank reads, -1 for synthetic data
    paths: tuple[str, ...] = ()


def fingerprint(shard_names_with_sizes, n_batches: int) -> str:
    """Hex digest of the dataset as this rank sees it (every shard, not only its
    own, so two nodes with different shard lists differ) and its batch count.

    Ranks with unequal batch counts differ too, rightly: the rank with fewer
    batches leaves the loop first and its peers hang in all-reduce.
    """
    h = hashlib.sha256()
    for name, size in shard_names_with_sizes:
        h.update(f"{name}\0{size}\n".encode())
    h.update(f"batches={n_batches}".encode())
    return h.hexdigest()[:16]


def synthetic_fingerprint(seed: int, vocab_size: int, seq_len: int) -> str:
    return hashlib.sha256(f"synthetic seed={seed} vocab={vocab_size} seq_len={seq_len}"
                          .encode()).hexdigest()[:16]


def stride(items, rank: int, world_size: int):
    """The items rank `rank` takes: every world_size-th, starting at its rank."""
    return list(items)[rank::world_size]


def batches_in_shard(size_bytes: int, batch_size: int, seq_len: int) -> int:
    """Whole (B, T+1) batches in a shard; windows advance by T and never cross shards."""
    windows = max(0, size_bytes // TOKEN_BYTES - 1) // seq_len
    return windows // batch_size


# --- synthetic -------------------------------------------------------------------
def _pattern(vocab_size: int, seed: int, length: int = 97) -> torch.Tensor:
    # A fixed random cycle of tokens: learnable (the next token follows from the
    # current one) yet not trivial; a prime length so windows start everywhere.
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (length,), generator=g)


def _noisy_windows(pattern: torch.Tensor, n: int, width: int, vocab_size: int,
                   g: torch.Generator) -> torch.Tensor:
    starts = torch.randint(0, pattern.numel(), (n, 1), generator=g)
    rows = pattern[(starts + torch.arange(width)) % pattern.numel()]
    noise = torch.rand(rows.shape, generator=g) < NOISE
    return torch.where(noise, torch.randint(0, vocab_size, rows.shape, generator=g), rows)


def synthetic_batches(batch_size: int, seq_len: int, vocab_size: int, seed: int,
                      rank: int) -> Iterator[torch.Tensor]:
    """Endless (B, T+1) batches of a noisy repeating pattern; each rank its own."""
    pattern = _pattern(vocab_size, seed)
    g = torch.Generator().manual_seed(seed * 1_000_003 + rank + 1)
    while True:
        yield _noisy_windows(pattern, batch_size, seq_len + 1, vocab_size, g)


# --- shards ----------------------------------------------------------------------
def list_shards(directory: str) -> list[tuple[str, int]]:
    """(name, size in bytes) of every *.bin shard in `directory`, sorted by name."""
    names = sorted(n for n in os.listdir(directory) if n.endswith(".bin"))
    return [(n, os.path.getsize(os.path.join(directory, n))) for n in names]


def plan_shards(directory: str, rank: int, world_size: int, batch_size: int, seq_len: int,
                *, drop_last_shard: bool = False) -> DataPlan:
    """Which shards this rank reads and how many batches that makes.

    `drop_last_shard` is the data-mismatch fault: this rank sees the dataset
    without its last file, like a node that missed a download.
    """
    shards = list_shards(directory)
    if not shards:
        raise ValueError("no *.bin shards there")
    if drop_last_shard:
        shards = shards[:-1]
    mine = stride(shards, rank, world_size)
    n_batches = sum(batches_in_shard(size, batch_size, seq_len) for _, size in mine)
    return DataPlan(
        description=f"{len(shards)} shards in {directory}, this rank reads {len(mine)} "
                    f"({n_batches} batches)",
        fingerprint=fingerprint(shards, n_batches), batches=n_batches, shards=len(mine),
        paths=tuple(os.path.join(directory, name) for name, _ in mine))


def read_shard(path: str) -> torch.Tensor:
    """A shard's tokens as int64 (what nn.Embedding wants)."""
    data = array.array("H")
    with open(path, "rb") as f:
        raw = f.read()
    data.frombytes(raw[:len(raw) - len(raw) % TOKEN_BYTES])
    if sys.byteorder != "little":  # shards are little-endian on disk
        data.byteswap()
    if not data:
        return torch.empty(0, dtype=torch.long)
    return torch.frombuffer(data, dtype=torch.uint16).to(torch.long)


def shard_batches(paths, batch_size: int, seq_len: int,
                  vocab_size: int) -> Iterator[torch.Tensor]:
    """(B, T+1) windows from each shard in turn; ends when the shards do."""
    for path in paths:
        tokens = read_shard(path)
        if tokens.numel() and int(tokens.max()) >= vocab_size:
            raise ValueError(f"{path}: token {int(tokens.max())} >= --vocab-size {vocab_size}")
        for b in range(batches_in_shard(tokens.numel() * TOKEN_BYTES, batch_size, seq_len)):
            starts = (b * batch_size + torch.arange(batch_size)) * seq_len
            yield tokens[starts[:, None] + torch.arange(seq_len + 1)]


def write_shards(directory: str, n_shards: int, tokens_per_shard: int, vocab_size: int,
                 seed: int = 0) -> list[str]:
    """Write shard_00000.bin... of the synthetic pattern (for tests and demos)."""
    if not 0 < vocab_size <= 65536:
        raise ValueError(f"vocab_size {vocab_size} does not fit uint16 tokens")
    os.makedirs(directory, exist_ok=True)
    pattern = _pattern(vocab_size, seed)
    g = torch.Generator().manual_seed(seed)
    paths = []
    for i in range(n_shards):
        tokens = _noisy_windows(pattern, 1, tokens_per_shard, vocab_size, g)[0]
        data = array.array("H", tokens.tolist())
        if sys.byteorder != "little":
            data.byteswap()
        path = os.path.join(directory, f"shard_{i:05d}.bin")
        with open(path, "wb") as f:
            data.tofile(f)
        paths.append(path)
    return paths


def synthetic_plan(seed: int, vocab_size: int, seq_len: int) -> DataPlan:
    return DataPlan(description=f"synthetic noisy pattern (seed {seed}, endless)",
                    fingerprint=synthetic_fingerprint(seed, vocab_size, seq_len),
                    batches=-1, shards=-1)
