"""The plan's JSONL text (umlos_cuda/batching/plans/lines.py) is, byte for byte, ``json.dumps`` per line.

* sample_ids.jsonl: ``json.dumps(id) + "\\n"`` for any ids (hypothesis: plain ASCII, quotes,
  backslashes, control characters, DEL, non-ASCII, astral characters).
* microbatches.jsonl: ``json.dumps(plan.microbatch(e, j).to_json()) + "\\n"`` for bucketed and packed
  plans, shards (global indices), ids or row numbers, and chunks that end anywhere (a tiny chunk size).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from umlos_cuda.batching import BatchingConfig, BatchPlanBuilder, shard_plan
from umlos_cuda.batching.packing.config import PackingConfig
from umlos_cuda.batching.plans import lines

any_text = st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=8)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(any_text, st.text(alphabet="abc_0123-./ ", max_size=8)), min_size=1, max_size=30))
def test_sample_ids_lines_are_json_dumps(ids):
    text = b"".join(lines.sample_ids_lines(ids))
    assert text == "".join(json.dumps(i) + "\n" for i in ids).encode("ascii")
    assert lines.is_plain("".join(ids)) == all(json.dumps(i) == f'"{i}"' for i in ids)


def _reference(plan, epoch: int) -> bytes:
    return "".join(json.dumps(spec.to_json()) + "\n" for spec in plan.iter_epoch(epoch)).encode("ascii")


def _plan(n: int, seed: int, packed: bool, ids):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 90, n)
    if packed:
        config = BatchingConfig(256, (), 64, seed=seed, pack=PackingConfig(64, "greedy", separator_len=seed % 3))
    else:
        config = BatchingConfig(256, (16, 32), 64, seed=seed)
    return BatchPlanBuilder(lengths, config, tokenizer_hash="t", sample_ids=ids).build(2)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 120), st.integers(0, 2 ** 16), st.booleans(), st.sampled_from(["rows", "plain", "odd"]),
       st.integers(1, 40), st.integers(1, 3))
def test_microbatch_lines_are_json_dumps(monkeypatch_module, n, seed, packed, kind, chunk, world):
    ids = {"rows": None, "plain": [f"train_{i:05d}" for i in range(n)],
           "odd": [f'naïve "{i}"\\\x7f\n☃𝄞' for i in range(n)]}[kind]
    plan = _plan(n, seed, packed, ids)
    monkeypatch_module.setattr(lines, "CHUNK_ENTRIES", chunk)
    for part in [plan] + [shard_plan(plan, r, world) for r in range(world)] * (world > 1):
        texts = None if part.sample_ids is None else lines.id_texts(part.sample_ids)
        for epoch in part.epochs:
            assert b"".join(lines.microbatch_lines(epoch, texts)) == _reference(part, epoch.epoch)


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch
