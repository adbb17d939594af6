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

from batching_cases import small_plan
from umlos_cuda.batching import BatchingConfig, BatchPlanBuilder, shard_plan
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


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 120), st.integers(0, 2 ** 16), st.booleans(), st.sampled_from(["rows", "plain", "odd"]),
       st.integers(1, 40), st.integers(1, 3))
def test_microbatch_lines_are_json_dumps(monkeypatch_module, n, seed, packed, kind, chunk, world):
    ids = {"rows": None, "plain": [f"train_{i:05d}" for i in range(n)],
           "odd": [f'naïve "{i}"\\\x7f\n☃𝄞' for i in range(n)]}[kind]
    plan = small_plan(n, seed, packed, ids)
    monkeypatch_module.setattr(lines, "CHUNK_ENTRIES", chunk)
    for part in [plan] + [shard_plan(plan, r, world) for r in range(world)] * (world > 1):
        texts = None if part.sample_ids is None else lines.id_texts(part.sample_ids)
        for epoch in part.epochs:
            assert b"".join(lines.microbatch_lines(epoch, texts)) == _reference(part, epoch.epoch)


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(any_text, st.text(alphabet='ab"\\ \n', max_size=4)), min_size=1, max_size=20, unique=True),
       st.integers(-1, 1))
def test_sample_ids_read_back_as_json_loads_reads_them(tmp_path_factory, ids, extra):
    """read_sample_ids reads what sample_ids_lines wrote, and refuses a wrong count as the line-by-line
    reader does (the same message)."""
    from umlos_cuda import errors
    from umlos_cuda.batching.plans import io
    from umlos_cuda.errors import UmlosError

    path = tmp_path_factory.mktemp("ids") / "sample_ids.jsonl"
    path.write_bytes(b"".join(lines.sample_ids_lines(ids)))
    count = len(ids) + extra
    if extra == 0:
        assert io.read_sample_ids(str(path), count) == ids
        return
    with pytest.raises(UmlosError) as fast:
        io.read_sample_ids(str(path), count)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(io, "parse_sample_ids", lambda block: None)
        with pytest.raises(UmlosError) as slow:
            io.read_sample_ids(str(path), count)
    assert fast.value.code == slow.value.code == errors.PLAN_FORMAT_INVALID
    assert fast.value.message == slow.value.message


@pytest.mark.parametrize("block", [b'"\n"a""\n', b'"\n', b'"a"\n"\n', b'"a\\"b"\n', b'"a"b"\n', b'"a" \n', b' "a"\n',
                                   b'"a"', b'"caf\xc3\xa9"\n', b'"a\tb"\n', b'"a"\n\n"b"\n'])
def test_parse_sample_ids_leaves_every_other_block_to_the_line_reader(block):
    assert lines.parse_sample_ids(block) is None
    assert lines.parse_sample_ids(b'"a"\n"b c"\n""\n') == ["a", "b c", ""]


@pytest.mark.parametrize("options", ["split", "overlong_split", "overlong_truncate"])
def test_saved_microbatches_are_json_dumps_with_splits_and_overlong_policies(tmp_path, options):
    """Plans with a train/validation split (written by lines.py) and with over-long policies (written
    line by line, with pieces) hold json.dumps' lines."""
    from umlos_cuda.batching import save_plan
    from umlos_cuda.batching.plans.overlong import OverlongConfig, OverlongPolicy
    from umlos_cuda.batching.plans.splits import SplitConfig

    lengths = np.random.default_rng(5).integers(1, 90, 200)
    extra = {"split": {"split": SplitConfig("train", 0.25, seed=3)},
             "overlong_split": {"overlong": OverlongConfig(32, OverlongPolicy.SPLIT)},
             "overlong_truncate": {"overlong": OverlongConfig(32)}}[options]
    config = BatchingConfig(256, (16, 32), 64, seed=2, **extra)
    plan = BatchPlanBuilder(lengths, config, tokenizer_hash="t", sample_ids=[f"s{i}" for i in range(200)]).build(2)
    save_plan(plan, tmp_path / "plan")
    for epoch in plan.epochs:
        written = (tmp_path / "plan" / f"epoch_{epoch.epoch}" / "microbatches.jsonl").read_bytes()
        assert written == _reference(plan, epoch.epoch) and written
    assert (b'"pieces"' in written) == (options == "overlong_split")
