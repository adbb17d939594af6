"""Every plan kind whose microbatches are rows of one dataset is taken where rows are handed out: a windowed plan
as a whole plan (``as_batch_plan``) for ``plan shard``, the same microbatches in order; ``batch generate`` writes a
windowed plan's microbatches as they are, the folder keeping the windowed plan itself (no whole plan built)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from token_cases import make_store

from umlos_cuda.batching.batches.reader import BatchReader
from umlos_cuda.batching.collate import FIELDS, collate_microbatch
from umlos_cuda.batching.lengths.sources import ArrayLengths
from umlos_cuda.batching.plans.builder import BatchPlanBuilder
from umlos_cuda.batching.packing.config import PackingConfig
from umlos_cuda.batching.plans.config import BatchingConfig
from umlos_cuda.batching.plans.io import load_plan
from umlos_cuda.batching.plans.kinds import plan_kind_of
from umlos_cuda.batching.plans.windows import WindowDefinition, WindowedPlan, load_windowed_plan
from umlos_cuda.cli import main
from umlos_cuda.errors import UmlosError

CONFIG = BatchingConfig.predictable(token_budget=512, bucket_edges=(32, 64, 128), overflow_max=256, seed=3)


def rows_of(plan, epoch: int) -> list[tuple]:
    """``(global index, rows, bucket, pad length)`` of every microbatch of ``epoch`` (a shard's only)."""
    specs = plan.iter_epoch(epoch) if hasattr(plan, "iter_epoch") else \
        (m for e, _, m in plan.iter_from(epoch, 0) if e == epoch)
    return [(m.index, tuple(int(r) for r in m.rows), m.bucket_id, m.max_len) for m in specs]


@pytest.fixture(scope="module")
def lengths() -> np.ndarray:
    return np.random.default_rng(11).integers(1, 300, size=500).astype(np.uint32)


@pytest.mark.parametrize("pack", [False, True])
def test_a_window_over_the_whole_epoch_is_the_whole_plan(lengths, pack):
    config = CONFIG if not pack else BatchingConfig.predictable(token_budget=1024, bucket_edges=(), overflow_max=256,
                                                                seed=3, pack=PackingConfig(max_length=256))
    windowed = WindowedPlan.build(WindowDefinition(config, lengths.shape[0], 1 << 16), ArrayLengths(lengths), 2)
    whole = BatchPlanBuilder(lengths, config).build(2)
    assert windowed.as_batch_plan().fingerprint == whole.fingerprint


@pytest.mark.parametrize("window", [16, 100, 333])
def test_a_windowed_plan_as_a_whole_plan_holds_its_microbatches(lengths, window):
    windowed = WindowedPlan.build(WindowDefinition(CONFIG, lengths.shape[0], window), ArrayLengths(lengths), 2)
    whole = windowed.as_batch_plan()
    for epoch in range(2):
        assert rows_of(whole, epoch) == rows_of(windowed, epoch)
        assert whole.epochs[epoch].stats["microbatches"] == windowed.epoch_counts(epoch)["microbatches"]
        assert whole.epochs[epoch].stats["skipped_samples"] == windowed.epoch_counts(epoch)["skipped"]
    with pytest.raises(UmlosError, match="not the 500 lengths"):
        windowed.as_batch_plan(lengths[::-1].copy())


def test_plan_shard_and_batch_generate_take_a_windowed_plan(tmp_path, capsys):
    store = make_store(tmp_path / "s", 120, seed=5)
    root = str(store.root)
    folder = tmp_path / "windowed"
    assert main(["plan", "build", "--source", root, "--window", "32", "--token-budget", "1024", "--bucket-edges",
                 "64,128", "--overflow-max", "512", "--epochs", "2", "--quiet", "--output", str(folder)]) == 0
    windowed = load_windowed_plan(folder)
    assert main(["plan", "shard", str(folder), "--world-size", "3", "--output", str(tmp_path / "shards")]) == 0
    assert main(["verify", str(tmp_path / "shards")]) == 0
    shards = [load_plan(tmp_path / "shards" / f"rank_{r}") for r in range(3)]
    for epoch in range(2):
        merged = sorted(m for shard in shards for m in rows_of(shard, epoch))
        assert merged == rows_of(windowed, epoch)
    shards_index = json.loads((tmp_path / "shards" / "shards.json").read_text())
    assert shards_index["source_fingerprint"] == windowed.as_batch_plan().fingerprint
    out = tmp_path / "batches"
    assert main(["batch", "generate", "--plan", str(folder), "--source", root, "--output", str(out),
                 "--workers", "1", "--quiet"]) == 0
    assert main(["batch", "check", str(out), "--source", root]) == 0
    assert plan_kind_of(out / "plan").name == "windowed plan"  # the windowed plan itself, its lengths the store's
    assert json.loads((out / "plan" / "meta.json").read_text())["lengths_path"] == root
    index = json.loads((out / "batches.json").read_text())
    assert (index["format"], index["plan_kind"], index["plan_fingerprint"]) == \
        ("umlos_cuda.batch_files/3", "windowed plan", windowed.fingerprint)
    assert [(s["name"], s["path"], s["lengths"]) for s in index["sources"]] == [("", root, windowed.source.binding())]
    reader = BatchReader(out)
    assert len(reader) == sum(windowed.epoch_microbatches(e) for e in range(2))
    for epoch in range(2):
        files = list(reader.iter_epoch(epoch))
        assert [(int(f["index"]), tuple(f["rows"].tolist()), int(f["bucket_id"]), int(f["max_len"])) for f in files] \
            == rows_of(windowed, epoch)
        for f in files:  # every file holds what collation of the windowed plan's microbatch gives
            batch = collate_microbatch(store, windowed.microbatch(epoch, int(f["index"])))
            assert all(np.array_equal(f[name], getattr(batch, name)) for name in FIELDS)
    rank = reader.shard(1, 2)
    assert [int(f["index"]) for f in rank.iter_epoch(1)] == list(range(1, windowed.epoch_microbatches(1), 2))
    assert rank.verify(root)["files"] == len(rank)


def test_a_kind_whose_microbatches_are_not_rows_is_refused(tmp_path):
    store = make_store(tmp_path / "s", 60, seed=6)
    out = tmp_path / "seq"
    assert main(["plan", "cut", "--source", str(store.root), "--sequence-length", "16", "--window", "8", "--quiet",
                 "--output", str(out)]) == 0
    assert main(["plan", "shard", str(out), "--world-size", "2", "--output", str(tmp_path / "shards")]) == 2
