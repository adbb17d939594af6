"""umlos_cuda.dali.IndexSource: the plain callable protocol (no DALI needed),
then real DALI CPU pipelines that read samples by these indices (skipped with a
reason when nvidia-dali is not installed), and a GPU pipeline where there is one.
"""

from __future__ import annotations

import contextlib
import types

import numpy as np
import pytest

import umlos_cuda as uc
from umlos_cuda.dali import IndexSource

N, G = 50, 12
MANIFEST = {
    "seed": 3,
    "global_batch_size": G,
    "data": {"sampler_block_size": 8},
    "datasets": {"train": {"id": "toy", "version": 1, "hash": "", "cardinality": N}},
}
DATA = (np.arange(N * 3, dtype=np.float32).reshape(N, 3) + 0.5)


def info(iteration, epoch_idx=0):
    return types.SimpleNamespace(iteration=iteration, epoch_idx=epoch_idx)


def ints(batch):
    """A CPU output (one 0-d array per sample) as a list of ints."""
    assert isinstance(batch, list) and all(isinstance(x, np.ndarray) and x.shape == () for x in batch)
    return [int(x) for x in batch]


def shard_epoch(source, epoch_idx):
    """What DALI would receive in one epoch, until StopIteration."""
    out = []
    for it in range(100):
        try:
            out.append(source(info(it, epoch_idx)))
        except StopIteration:
            return out
    raise AssertionError("the epoch never ended")


def expected_micro_batches(world, rank, epoch, stage="train", manifest=MANIFEST):
    out, cursor = [], uc.Cursor(epoch, 0)
    while cursor.epoch == epoch:
        b = uc.next_batch(manifest, "train", world, rank, stage=stage, cursor=cursor, backend="numpy")
        out.append(b.indices.tolist())
        cursor = b.cursor
    return out


# -- the callable protocol ----------------------------------------------------------


@pytest.mark.parametrize("stage", ["train", "eval"])
def test_batches_are_next_batch_micro_batches(stage):
    for rank in range(4):
        src = IndexSource(MANIFEST, "train", shard_id=rank, num_shards=4, stage=stage)
        assert src.micro_batch_size == 3 and src.num_outputs == 1
        for epoch_idx in (0, 1):
            got = shard_epoch(src, epoch_idx)
            assert all(x.dtype == np.int64 for b in got for x in b)
            expected = [b for b in expected_micro_batches(4, rank, epoch_idx, stage) if b]
            assert [ints(b) for b in got] == expected


def test_shards_in_order_equal_the_global_sequence():
    sources = [IndexSource(MANIFEST, "train", shard_id=r, num_shards=4) for r in range(4)]
    merged = []
    for it in range(5):
        for s in sources:
            with contextlib.suppress(StopIteration):
                merged.extend(ints(s(info(it, 1))))
    assert merged == uc.epoch_indices(MANIFEST, "train", epoch=1, backend="numpy").tolist()


def test_is_pure_in_iteration_and_epoch():
    src = IndexSource(MANIFEST, "train", shard_id=1, num_shards=2)
    a = ints(src(info(3, 2)))
    src(info(0, 0))
    assert ints(src(info(3, 2))) == a  # DALI's prefetching may call out of order


def test_resume_from_a_checkpointed_cursor():
    src = IndexSource(MANIFEST, "train", shard_id=0, num_shards=2)
    first = shard_epoch(src, 0)
    saved = src.cursor_after(0, 1)  # the pipeline consumed iterations 0 and 1
    assert saved == uc.Cursor(0, 2 * G)
    resumed = IndexSource(MANIFEST, "train", shard_id=0, num_shards=2, cursor=saved)
    assert [ints(b) for b in shard_epoch(resumed, 0)] == [ints(b) for b in first[2:]]
    assert [ints(b) for b in shard_epoch(resumed, 1)] == [ints(b) for b in shard_epoch(src, 1)]
    assert src.cursor_after(0, 4) == uc.Cursor(1, 0)
    assert src.cursor_at(0, 5) is None


def test_resume_at_another_shard_count():
    """A cursor written by 4 shards resumes on 2 with the same global sequence."""
    four = IndexSource(MANIFEST, "train", shard_id=0, num_shards=4)
    saved = four.cursor_after(0, 1)
    two = [IndexSource(MANIFEST, "train", shard_id=r, num_shards=2, cursor=saved) for r in range(2)]
    merged = []
    for it in range(3):
        for s in two:
            try:
                merged.extend(ints(s(info(it, 0))))
            except StopIteration:  # shard 1's slice of the last, 2-sample batch is empty
                assert (it, s.shard_id) == (2, 1)
    assert merged == uc.epoch_indices(MANIFEST, "train", epoch=0, start=2 * G, backend="numpy").tolist()


def test_integer_calls_count_epochs():
    """With batch_info=False DALI passes the iteration only."""
    src = IndexSource(MANIFEST, "train", shard_id=0, num_shards=1)
    epoch0 = [ints(src(i)) for i in range(5)]
    with pytest.raises(StopIteration):
        src(5)
    epoch1 = [ints(src(i)) for i in range(5)]
    assert epoch0 == expected_micro_batches(1, 0, 0) and epoch1 == expected_micro_batches(1, 0, 1)


def test_reader_and_pad_outputs():
    src = IndexSource(MANIFEST, "train", shard_id=3, num_shards=4, reader=lambda i: DATA[i], pad=True)
    assert src.num_outputs == 3
    batches = shard_epoch(src, 0)
    assert len(batches) == 5  # padded: every shard takes every iteration
    for indices, samples, valid in batches:
        assert len(indices) == len(samples) == len(valid) == 3
        assert all(np.array_equal(s, DATA[i]) for i, s in zip(ints(indices), samples))
    assert [bool(v) for v in batches[-1][2]] == [False, False, False]  # shard 3's slice of the last batch is empty
    assert all(bool(v) for _, _, valid in batches[:-1] for v in valid)


def test_empty_slice_ends_the_epoch_without_pad():
    src = IndexSource(MANIFEST, "train", shard_id=3, num_shards=4)
    assert len(shard_epoch(src, 0)) == 4  # DALI refuses empty batches


@pytest.mark.parametrize(
    "kwargs, code",
    [
        ({"num_shards": 5, "shard_id": 0}, "BATCH_SIZE_INCONSISTENT"),
        ({"num_shards": 4, "shard_id": 4}, "INVALID_RANK"),
        ({"device": "tpu"}, "INVALID_ARGUMENT"),
        ({"stage": "test"}, "INVALID_STAGE_TYPE"),
        ({"cursor": uc.Cursor(0, 60)}, "GLOBAL_POSITION_EXCEEDS_CARDINALITY"),
    ],
)
def test_errors(kwargs, code):
    with pytest.raises(uc.UmlosError) as exc:
        IndexSource(MANIFEST, "train", **({"shard_id": 0, "num_shards": 1} | kwargs))
    assert exc.value.code == code


def test_cursor_at_refuses_negative_iterations():
    src = IndexSource(MANIFEST, "train", shard_id=0, num_shards=1)
    with pytest.raises(uc.UmlosError, match="iteration must be an integer >= 0") as info:
        src.cursor_at(0, -1)
    assert info.value.code == "INVALID_ARGUMENT" and info.value.record["failure_operator"] == "umlos_cuda.dali"


# -- real DALI pipelines ------------------------------------------------------------


def _dali():
    return pytest.importorskip("nvidia.dali", reason="nvidia-dali is not installed (the optional 'dali' extra)")


def _run_epoch(pipe, outputs):
    got = []
    while True:
        try:
            out = pipe.run()
        except StopIteration:
            pipe.reset()
            return got
        got.append([[np.array(t) for t in out[k]] for k in range(outputs)])


def test_cpu_pipeline_reads_samples_by_these_indices():
    dali = _dali()
    from nvidia.dali import pipeline_def

    import umlos_cuda.dali as ud

    src = IndexSource(MANIFEST, "train", shard_id=1, num_shards=2, reader=lambda i: DATA[i])

    @pipeline_def(batch_size=src.micro_batch_size, num_threads=1, device_id=None, prefetch_queue_depth=2)
    def pipe():
        indices, samples = ud.external_source(src)
        return indices, samples * 2.0  # a DALI operator on what was read

    p = pipe()
    p.build()
    for epoch in range(2):
        got = _run_epoch(p, 2)
        expected = [b for b in expected_micro_batches(2, 1, epoch) if b]  # DALI gets no empty batch
        assert [[int(i) for i in b[0]] for b in got] == expected
        for b, idx in zip(got, expected):
            assert np.array_equal(np.stack(b[1]), DATA[idx] * 2.0)
    assert dali.__version__


def test_cpu_pipeline_resumes_from_a_cursor():
    _dali()
    from nvidia.dali import pipeline_def

    import umlos_cuda.dali as ud

    def build(cursor):
        src = IndexSource(MANIFEST, "train", shard_id=0, num_shards=1, cursor=cursor)

        @pipeline_def(batch_size=src.micro_batch_size, num_threads=1, device_id=None)
        def pipe():
            return ud.external_source(src)

        p = pipe()
        p.build()
        return src, p

    src, p = build(None)
    first = [int(np.array(i)) for _ in range(2) for i in p.run()[0]]
    saved = src.cursor_after(0, 1)
    _, resumed = build(saved)
    rest = [int(i) for b in _run_epoch(resumed, 1) for i in b[0]]
    assert first + rest == uc.epoch_indices(MANIFEST, "train", epoch=0, backend="numpy").tolist()


def test_parallel_external_source_in_worker_processes():
    """DALI's parallel mode pickles the source into worker processes."""
    _dali()
    from nvidia.dali import fn, pipeline_def

    src = IndexSource(MANIFEST, "train", shard_id=0, num_shards=2)

    @pipeline_def(batch_size=src.micro_batch_size, num_threads=1, device_id=None, py_num_workers=1,
                  py_start_method="spawn")
    def pipe():
        return fn.external_source(source=src, batch=True, batch_info=True, parallel=True)

    p = pipe()
    p.build()
    got = [[int(np.array(i)) for i in p.run()[0]] for _ in range(2)]
    assert got == expected_micro_batches(2, 0, 0)[:2]


def test_gpu_pipeline_gets_cupy_batches():
    _dali()
    cupy = pytest.importorskip("cupy", reason="CuPy is not installed (the optional 'gpu' extra)")
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            pytest.skip("no CUDA device")
    except cupy.cuda.runtime.CUDARuntimeError as exc:
        pytest.skip(f"no CUDA device: {exc}")
    from nvidia.dali import pipeline_def

    import umlos_cuda.dali as ud

    src = IndexSource(MANIFEST, "train", shard_id=0, num_shards=2, device="gpu")
    assert isinstance(src(info(0)), cupy.ndarray)

    @pipeline_def(batch_size=src.micro_batch_size, num_threads=1, device_id=0)
    def pipe():
        return ud.external_source(src)

    p = pipe()
    p.build()
    got = [int(np.array(i)) for i in p.run()[0].as_cpu()]
    assert got == expected_micro_batches(2, 0, 0)[0]
