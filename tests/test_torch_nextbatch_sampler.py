"""umlos_cuda.torch.NextBatchSampler and DistributedEvalSampler in one process.

NextBatchSampler must yield exactly ``next_batch``'s micro-batches, own the
cursor, and resume from a state written at any world size with the identical
global sequence; DistributedEvalSampler must cover every sample once with
equal steps per rank and masked, never duplicated, padding.
"""

from __future__ import annotations

import json

import cbor2
import pytest

import umlos_cuda as uc
from umlos_cuda.torch import (
    DistributedEvalSampler,
    MaskedDataset,
    NextBatchSampler,
    Padding,
    SamplerArgumentError,
)

N = 50
G = 12


def manifest(n=N, g=G, drop_last=False, seed=11):
    return uc.Manifest.from_dict(
        {
            "seed": seed,
            "global_batch_size": g,
            "data": {"sampler_block_size": 8, "drop_last": drop_last},
            "datasets": {"train": {"id": "toy", "version": 1, "hash": "", "cardinality": n}},
        }
    )


def global_batches(m, stage, epochs, key="train"):
    """The W = 1 sequence of global batches, straight from next_batch."""
    out, cursor = [], uc.Cursor(0, 0)
    while cursor.epoch < epochs:
        b = uc.next_batch(m, key, 1, 0, stage=stage, cursor=cursor, backend="numpy")
        out.append(((cursor.epoch, cursor.global_index), b.indices.tolist()))
        cursor = b.cursor
    return out


def run(sampler, epochs):
    """Records ((epoch, global_position), micro-batch) for `epochs` passes."""
    out = []
    for _ in range(epochs):
        for batch in sampler:
            meta = sampler.last_metadata
            out.append(((meta["epoch"], meta["global_position"]), batch))
    return out


def merge(per_rank):
    steps = {}
    for records in per_rank:
        for key, batch in records:
            steps.setdefault(key, []).extend(batch)
    return sorted(steps.items())


@pytest.mark.parametrize("w", [1, 2, 3, 4, 6, 12])
@pytest.mark.parametrize("stage", ["train", "eval"])
@pytest.mark.parametrize("drop_last", [False, True])
def test_ranks_in_order_equal_the_w1_sequence(w, stage, drop_last):
    m = manifest(drop_last=drop_last)
    samplers = [NextBatchSampler(m, "train", stage=stage, rank=r, world_size=w) for r in range(w)]
    per_rank = [run(s, 2) for s in samplers]
    assert [len(s) * 2 for s in samplers] == [len(x) for x in per_rank]
    assert merge(per_rank) == global_batches(m, stage, 2)
    assert all(len(b) <= G // w for records in per_rank for _, b in records)
    assert all(b for records in per_rank for _, b in records), "an empty micro-batch was yielded"


def test_micro_batches_are_next_batch_slices():
    m = manifest()
    s = NextBatchSampler(m, "train", rank=2, world_size=4)
    cursor = uc.Cursor(0, 0)
    for batch in s:
        expected = uc.next_batch(m, "train", 4, 2, cursor=cursor, backend="numpy")
        assert batch == expected.indices.tolist()
        assert s.last_metadata["sampler_config_hash"] == expected.metadata["sampler_config_hash"]
        assert s.cursor == expected.cursor
        cursor = expected.cursor


def test_one_pass_is_one_epoch_and_the_cursor_is_owned():
    s = NextBatchSampler(manifest(), "train", rank=0, world_size=2)
    assert len(list(s)) == 5 and s.cursor == uc.Cursor(1, 0)
    it = iter(s)
    next(it)
    assert s.cursor == uc.Cursor(1, G)  # advanced when the batch was handed out
    assert s.state_dict()["cursor"] == {"epoch": 1, "global_index": G}


def test_len_counts_this_ranks_batches():
    m = manifest()  # 50 = 4 * 12 + 2: the last global batch has 2 samples
    assert [len(NextBatchSampler(m, "train", rank=r, world_size=4)) for r in range(4)] == [5, 4, 4, 4]
    assert [len(NextBatchSampler(m, "train", rank=r, world_size=4, pad=True)) for r in range(4)] == [5] * 4
    assert [len(NextBatchSampler(manifest(drop_last=True), "train", rank=r, world_size=4)) for r in range(4)] == [4] * 4


def test_pad_gives_every_rank_full_micro_batches():
    m = manifest()
    per_rank = [list(NextBatchSampler(m, "train", rank=r, world_size=4, pad=True)) for r in range(4)]
    assert all(len(batches) == 5 and all(len(b) == 3 for b in batches) for batches in per_rank)
    real = [i for batches in per_rank for b in batches for i in b if not isinstance(i, Padding)]
    assert sorted(real) == list(range(N))
    last = [batches[-1] for batches in per_rank]
    assert isinstance(last[0][2], Padding) and last[0][2].fill == last[0][0]
    assert all(all(isinstance(i, Padding) and i.fill == 0 for i in b) for b in last[1:])


def test_set_epoch_keeps_a_cursor_inside_the_epoch():
    m = manifest()
    s = NextBatchSampler(m, "train", rank=0, world_size=1, cursor=uc.Cursor(3, 24))
    s.set_epoch(3)
    assert s.cursor == uc.Cursor(3, 24)
    s.set_epoch(5)
    assert s.cursor == uc.Cursor(5, 0)
    with pytest.raises(SamplerArgumentError):
        s.set_epoch(-1)


@pytest.mark.parametrize("w_before, w_after", [(4, 2), (4, 3), (4, 1), (2, 12), (6, 4)])
@pytest.mark.parametrize("steps", [0, 1, 3, 5])
def test_state_written_at_one_world_size_resumes_at_another(w_before, w_after, steps):
    m = manifest()
    w1 = global_batches(m, "train", 3)
    before = [NextBatchSampler(m, "train", rank=r, world_size=w_before) for r in range(w_before)]
    iters = [iter(s) for s in before]
    for _ in range(steps):  # lock-step; a rank with an empty slice has nothing to yield
        for s, it in zip(before, iters):
            if s.cursor.epoch == 0:
                next(it, None)
    states = [s.state_dict() for s in before]
    assert all(st == states[0] | {"world_size": w_before} for st in states)
    state = cbor2.loads(cbor2.dumps(states[0]))  # CBOR-safe plain data
    assert json.loads(json.dumps(state)) == state
    after = [NextBatchSampler(m, "train", rank=r, world_size=w_after) for r in range(w_after)]
    for s in after:
        s.load_state_dict(state)
    rest = merge([run(s, 3 - state["cursor"]["epoch"]) for s in after])
    position = (state["cursor"]["epoch"], state["cursor"]["global_index"])
    assert rest == [step for step in w1 if step[0] >= position]


def test_rank_and_world_size_defaults(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "3")
    s = NextBatchSampler(manifest(), "train")
    assert (s.rank, s.world_size, s.micro_batch_size) == (3, 4, 3)
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    s = NextBatchSampler(manifest(), "train")
    assert (s.rank, s.world_size, s.micro_batch_size) == (0, 1, G)


def test_manifest_from_a_file(tmp_path):
    path = tmp_path / "run.json"
    path.write_text(json.dumps(manifest().to_dict()))
    assert list(NextBatchSampler(str(path), "train", rank=0, world_size=1)) == list(
        NextBatchSampler(manifest(), "train", rank=0, world_size=1)
    )


@pytest.mark.parametrize(
    "kwargs, code, message",
    [
        ({"world_size": 5, "rank": 0}, "BATCH_SIZE_INCONSISTENT", "not divisible by world_size 5"),
        ({"world_size": 4, "rank": 4}, "INVALID_RANK", r"Invalid rank 4, rank should be in the interval \[0, 3\]"),
        ({"world_size": 0, "rank": 0}, "INVALID_RANK",
         r"Invalid world_size 0, world_size should be in the interval \[1, "),
        ({"stage": "test"}, "INVALID_STAGE_TYPE", "not one of train, eval, infer"),
        ({"dataset_key": "val"}, "INVALID_DATASET_KEY", "known keys: train"),
        ({"cursor": uc.Cursor(0, 50)}, "GLOBAL_POSITION_EXCEEDS_CARDINALITY", r"outside the epoch \[0, 49\]"),
        ({"dataset": list(range(49))}, "CARDINALITY_MISMATCH", "has 49 samples"),
        ({"backend": "tpu"}, "BACKEND_UNAVAILABLE", "choose one of"),
    ],
)
def test_constructor_errors(kwargs, code, message):
    kwargs = {"rank": 0, "world_size": 1, "dataset_key": "train"} | kwargs
    with pytest.raises(SamplerArgumentError, match=message) as exc:
        NextBatchSampler(manifest(), **kwargs)
    assert exc.value.code == code and isinstance(exc.value, ValueError)


@pytest.mark.parametrize(
    "change, code, message",
    [
        ({"manifest_hash": "00" * 32}, "SAMPLER_STATE_INVALID", "manifest_hash"),
        ({"dataset_key": "val"}, "SAMPLER_STATE_INVALID", "dataset_key"),
        ({"stage": "eval"}, "SAMPLER_STATE_INVALID", "stage"),
        ({"format": "x"}, "SAMPLER_STATE_INVALID", "not a NextBatchSampler state"),
        ({"cursor": {"epoch": 0, "global_index": 60}}, "GLOBAL_POSITION_EXCEEDS_CARDINALITY", "outside the epoch"),
        ({"cursor": {"epoch": 0}}, "SAMPLER_STATE_INVALID",
         "the state's cursor: .*exactly the keys epoch and global_index"),
    ],
)
def test_load_state_dict_refuses_a_foreign_state(change, code, message):
    s = NextBatchSampler(manifest(), "train", rank=0, world_size=1)
    state = s.state_dict() | change
    with pytest.raises(SamplerArgumentError, match=message) as info:
        s.load_state_dict(state)
    assert info.value.code == code
    assert s.cursor == uc.Cursor(0, 0)


def test_drives_a_dataloader_and_stateful_dataloader():
    torch = pytest.importorskip("torch", reason="torch is not installed (the optional 'torch' extra)")
    from torch.utils.data import DataLoader, TensorDataset

    data = TensorDataset(torch.arange(N) * 10)
    m = manifest()
    s = NextBatchSampler(m, "train", rank=1, world_size=2, dataset=data)
    read = [b[0].tolist() for b in DataLoader(data, batch_sampler=s)]
    assert read == [[10 * i for i in b] for _, b in run(NextBatchSampler(m, "train", rank=1, world_size=2), 1)]

    tdl = pytest.importorskip("torchdata.stateful_dataloader", reason="torchdata is not installed")
    loader = tdl.StatefulDataLoader(data, batch_sampler=NextBatchSampler(m, "train", rank=1, world_size=2))
    full = [b[0].tolist() for b in loader]
    first = tdl.StatefulDataLoader(data, batch_sampler=NextBatchSampler(m, "train", rank=1, world_size=2))
    it = iter(first)
    head = [next(it)[0].tolist() for _ in range(2)]
    state = first.state_dict()
    assert "umlos_cuda.torch.NextBatchSampler/1" in repr(state)
    second = tdl.StatefulDataLoader(data, batch_sampler=NextBatchSampler(m, "train", rank=1, world_size=2))
    second.load_state_dict(state)
    assert head + [b[0].tolist() for b in second] == full


# -- exact evaluation ---------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 7, 16, 17, 50, 63])
@pytest.mark.parametrize("w", [1, 2, 3, 4])
@pytest.mark.parametrize("batch_size", [1, 4])
def test_eval_every_sample_once_equal_steps(n, w, batch_size):
    samplers = [DistributedEvalSampler(n, batch_size, num_replicas=w, rank=r) for r in range(w)]
    per_rank = [list(s) for s in samplers]
    steps = -(-n // (batch_size * w))
    assert [len(s) for s in samplers] == [len(x) for x in per_rank] == [steps] * w
    assert all(len(b) == batch_size for batches in per_rank for b in batches)
    in_rank_order = [i for step in range(steps) for r in range(w) for i in per_rank[r][step]
                     if not isinstance(i, Padding)]
    assert in_rank_order == list(range(n))
    assert list(samplers[0]) == per_rank[0]  # a second pass is the same evaluation


def test_eval_empty_dataset():
    s = DistributedEvalSampler([], 4, num_replicas=2, rank=1)
    assert len(s) == 0 and list(s) == []


def test_eval_errors():
    with pytest.raises(SamplerArgumentError, match=r"batch_size 0 is outside \[1, "):
        DistributedEvalSampler(10, 0, num_replicas=1, rank=0)
    with pytest.raises(SamplerArgumentError, match=r"Invalid rank 2, rank should be in the interval \[0, 1\]"):
        DistributedEvalSampler(10, 2, num_replicas=2, rank=2)


def test_masked_dataset_and_padding_never_pass_as_a_sample():
    base = [10, 11, 12]
    ds = MaskedDataset(base)
    assert len(ds) == 3
    assert ds[1] == (11, True)
    assert ds[Padding(2)] == (12, False)
    with pytest.raises(TypeError):
        base[Padding(0)]  # a plain dataset refuses a padded slot: no silent duplicate


def test_eval_with_dataloader_gives_a_mask():
    torch = pytest.importorskip("torch", reason="torch is not installed (the optional 'torch' extra)")
    from torch.utils.data import DataLoader, TensorDataset

    data = TensorDataset(torch.arange(10) + 100)
    seen = []
    for r in range(3):
        loader = DataLoader(MaskedDataset(data), batch_sampler=DistributedEvalSampler(data, 2, num_replicas=3, rank=r))
        batches = list(loader)
        assert len(batches) == 2
        for (values,), mask in batches:
            assert mask.dtype == torch.bool and values.shape == (2,)
            seen.extend(values[mask].tolist())
    assert sorted(seen) == list(range(100, 110))


def test_batches_consumed_overrides_what_was_handed_out():
    s = NextBatchSampler(manifest(), "train", rank=0, world_size=4, cursor=uc.Cursor(2, 12))
    it = iter(s)
    [next(it) for _ in range(3)]  # a loader's prefetch ran ahead of the training loop
    assert s.state_dict()["cursor"] == {"epoch": 2, "global_index": 48}
    assert s.state_dict(batches_consumed=1)["cursor"] == {"epoch": 2, "global_index": 24}
    assert s.state_dict(batches_consumed=4)["cursor"] == {"epoch": 3, "global_index": 0}
    with pytest.raises(SamplerArgumentError, match="batches_consumed"):
        s.state_dict(batches_consumed=-1)
