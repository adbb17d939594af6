"""R9 metadata (docs/spec/nextbatch-v2.md §6) that no other test pins: ``effective_batch_size``,
``effective_q``, ``subsampling_mode`` and ``blocks_materialized``. Expected
values come from the definitions of §6, computed here independently of the
engine (``B_eff = global_batch_size``, ``effective_q = float64(B_eff) /
float64(N)``, ``SHUFFLE_WITHOUT_REPLACEMENT`` in train and ``NONE`` in
eval/infer, and the number of blocks of the epoch's plan, full and tail)."""

from __future__ import annotations

import numpy as np
import pytest

import oracle
import umlos_cuda as uc
from nbcases import raw_manifest

U64_MAX = 2**64 - 1


def expected_blocks(n: int, block_size: int) -> int:
    """Blocks of an epoch's plan (R5): the full ones plus the short tail, if any."""
    return n // block_size + (1 if n % block_size else 0)


@pytest.mark.parametrize(
    "n,block_size,g,world_size,stage,cursor",
    [
        (1000, 64, 48, 4, "train", (0, 0)),      # 15 full blocks and a tail of 40
        (1000, 64, 48, 4, "eval", (0, 0)),
        (1000, 64, 48, 2, "infer", (3, 960)),    # the final partial batch: 40 of 48
        (1000, 64, 48, 1, "train", (0, 984)),    # a partial train batch at the epoch's end
        (1024, 64, 64, 8, "train", (1, 64)),     # no tail block
        (1, 1, 1, 1, "train", (0, 0)),
        (5, 1 << 20, 8, 2, "train", (2, 0)),     # one block larger than N; G > N
        (U64_MAX, 1 << 63, 96, 3, "train", (7, U64_MAX - 96)),  # 1 full block and a tail of 2^63 - 1
        (U64_MAX, 1 << 63, 96, 3, "eval", (7, 0)),
    ],
)
def test_metadata_matches_the_r9_definitions(backend, n, block_size, g, world_size, stage, cursor):
    raw = raw_manifest(n, block_size, g)
    batch = uc.next_batch(raw, "train", world_size, world_size - 1, stage, uc.Cursor(*cursor), backend=backend)
    meta = batch.metadata
    assert meta["effective_batch_size"] == g  # B_eff = global_batch_size, even for a partial batch
    assert type(meta["effective_q"]) is float
    assert meta["effective_q"] == float(np.float64(g) / np.float64(n))
    if stage == "train":
        assert meta["subsampling_mode"] == "SHUFFLE_WITHOUT_REPLACEMENT" and meta["is_shuffled"] is True
        assert meta["blocks_materialized"] == expected_blocks(n, block_size)
    else:
        assert meta["subsampling_mode"] == "NONE" and meta["is_shuffled"] is False
        assert meta["blocks_materialized"] == 0  # eval/infer build no plan
    # produced_global_count is the truth beside B_eff: what the global batch really holds.
    expected = oracle.Oracle(raw).next_batch("train", 1, 0, stage, *cursor)
    assert meta["produced_global_count"] == min(g, n - cursor[1]) == len(expected.indices)


def test_known_values():
    """Literal values, so a wrong definition on both sides cannot agree."""
    meta = uc.next_batch(raw_manifest(1000, 64, 48), "train", 4, 0, "train", backend="numpy").metadata
    assert (meta["effective_batch_size"], meta["effective_q"], meta["blocks_materialized"]) == (48, 0.048, 16)
    assert meta["subsampling_mode"] == "SHUFFLE_WITHOUT_REPLACEMENT"
    meta = uc.next_batch(raw_manifest(U64_MAX, 1 << 63, 2**20), "train", backend="numpy").metadata
    assert meta["effective_q"] == 2.0**-44 and meta["blocks_materialized"] == 2  # float64(2^64 - 1) = 2^64


def test_streaming_is_train_subsampling():
    raw = raw_manifest(10, 4, 24)
    meta = uc.next_batch(raw, "train", 2, 1, preset="streaming_infinite", cursor=uc.Cursor(0, 8),
                         backend="numpy").metadata
    assert meta["subsampling_mode"] == "SHUFFLE_WITHOUT_REPLACEMENT"
    assert meta["blocks_materialized"] == 3 and meta["effective_batch_size"] == 24 and meta["effective_q"] == 2.4
