"""Batch plans over every engine sampling mode (``BatchingConfig.order``).

A plan's shuffle is the engine's epoch order, so a plan may follow any
registered mode; the default keeps the fingerprints of plans built before the
field existed (it is written to meta.json only when it is not the default).
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

import umlos_cuda as uc
from umlos_cuda import errors
from umlos_cuda.batching.plans.builder import BatchPlanBuilder
from umlos_cuda.batching.plans.config import BatchingConfig
from umlos_cuda.batching.plans.io import load_plan, save_plan
from umlos_cuda.batching.plans.verify import verify_plan
from umlos_cuda.batching.plans.planner import PLAN_DATASET_KEY, plan_manifest
from umlos_cuda.cli import main


def lengths_of(n=1200, seed=3):
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(5.0, 1.0, n), 1, 2000).astype(np.uint32)


def config(**changes):
    return dataclasses.replace(BatchingConfig.throughput(8192, (128, 256, 512, 1024), 2048, seed=5), **changes)


@pytest.mark.parametrize("order", ["feistel", "block_feistel"])
def test_a_plan_follows_the_engine_order_of_its_mode(tmp_path, order):
    lengths = lengths_of()
    plan = BatchPlanBuilder(lengths, config(order=order), tokenizer_hash="tok").build(1)
    manifest = plan_manifest(plan.config, lengths.shape[0])
    assert manifest.canonical["data"]["sampling_mode"] == order
    expected = uc.epoch_indices(manifest, PLAN_DATASET_KEY, 0, 0, lengths.shape[0], backend="numpy")
    # Each bucket takes its samples in the engine's order, so the plan's rows of
    # one bucket, in microbatch order, are a subsequence of that order.
    epoch = plan.epochs[0]
    position = np.empty(lengths.shape[0], dtype=np.int64)
    position[expected.astype(np.int64)] = np.arange(lengths.shape[0])
    for bucket in np.unique(epoch.bucket_ids):
        rows = np.concatenate([epoch.samples[epoch.offsets[i]:epoch.offsets[i + 1]]
                               for i in np.flatnonzero(epoch.bucket_ids == bucket)])
        assert np.all(np.diff(position[rows.astype(np.int64)]) > 0)
    assert plan.meta.sampling_mode.endswith(f"{order.upper()}_V1")

    folder = tmp_path / "plan"
    save_plan(plan, folder)
    meta = json.loads((folder / "meta.json").read_text())
    assert meta["order"] == order
    loaded = load_plan(folder)
    assert loaded.config.order == order
    assert verify_plan(folder)["fingerprint"] == plan.fingerprint  # the rebuild check reproduces it


def test_the_default_order_is_not_written_and_other_orders_change_the_plan():
    lengths = lengths_of()
    default = BatchPlanBuilder(lengths, config(), tokenizer_hash="tok").build(1)
    explicit = BatchPlanBuilder(lengths, config(order="block_affine"), tokenizer_hash="tok").build(1)
    other = BatchPlanBuilder(lengths, config(order="feistel"), tokenizer_hash="tok").build(1)
    assert "order" not in default.config.to_dict()
    assert explicit.fingerprint == default.fingerprint
    assert other.fingerprint != default.fingerprint
    assert not np.array_equal(other.epochs[0].samples, default.epochs[0].samples)


def test_an_unknown_order_is_refused_naming_the_modes():
    with pytest.raises(uc.UmlosError) as caught:
        config(order="fisher_yates")
    assert caught.value.code == errors.BATCHING_CONFIG_INVALID
    assert "block_affine" in caught.value.message and "feistel" in caught.value.message


def test_plan_build_takes_the_order(tmp_path, capsys):
    lengths = tmp_path / "lengths.jsonl"
    from umlos_cuda.batching.lengths.cache import LengthCache
    LengthCache.from_arrays(None, lengths_of(300), "tok").write(str(lengths))
    out = tmp_path / "plan"
    assert main(["plan", "build", "--lengths", str(lengths), "--bucket-edges", "128,256,512,1024",
                 "--overflow-max", "2048", "--token-budget", "8192", "--order", "feistel", "--quiet",
                 "--output", str(out)]) == 0
    assert load_plan(out).config.order == "feistel"
    assert main(["plan", "build", "--lengths", str(lengths), "--bucket-edges", "128", "--overflow-max", "128",
                 "--token-budget", "8192", "--order", "nope", "--output", str(tmp_path / "bad")]) == 2
    assert "BATCHING_CONFIG_INVALID" in capsys.readouterr().err
