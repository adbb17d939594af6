"""The PyTorch path over plans that truncate or split samples, and over plans of preference pairs.

A token store -> plans with an over-long policy (``truncate_right``, ``truncate_left``, ``split``; packed or
not, padded to the bucket or to the longest) on the train side of a split -> batch files, and a ``DataLoader``
with ``PlanBatchSampler``, ``TokenDataset`` and ``PlanCollator``: every batch, at several ranks and world sizes,
with and without workers, is bit for bit the tensors of ``collate_microbatch`` and of the batch file of the
same microbatch, in every preset; a pair plan's batches with ``pairs=True`` are ``collate_preference_microbatch``'s.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from token_cases import make_store, write_dataset  # noqa: E402
import umlos_cuda as uc  # noqa: E402
from umlos_cuda import errors  # noqa: E402
from umlos_cuda.batching import (BatchingConfig, BatchPlanBuilder, BatchReader, PackingConfig,  # noqa: E402
                                 collate_microbatch, collate_preference_microbatch, load_plan, save_plan,
                                 write_batches)
from umlos_cuda.batching.collate import FIELDS  # noqa: E402
from umlos_cuda.batching.plans.overlong import OverlongConfig  # noqa: E402
from umlos_cuda.batching.plans.splits import SplitConfig  # noqa: E402
from umlos_cuda.batching.presets import apply_preset  # noqa: E402
from umlos_cuda.torch import (PackedBatchSampler, PlanBatchSampler, PlanCollator, PlanKey,  # noqa: E402
                              TokenDataset)

#: (policy, packed, pad to the bucket): every policy that cuts, packed and not, both pad policies.
CASES = [("truncate_right", False, True), ("truncate_left", True, False), ("split", False, False),
         ("split", True, False)]


def expect(code, function, *args, mention: str = "", **kwargs):
    with pytest.raises(uc.UmlosError) as info:
        function(*args, **kwargs)
    assert info.value.code == code and mention in info.value.message, info.value.message
    return info.value


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A token store of 120 prompt/response records and, per case, a plan of 2 epochs with its batch files."""
    root = tmp_path_factory.mktemp("ranges")
    store = make_store(root, 120, seed=3)
    cache = store.length_cache()
    max_length = max(2, int(np.asarray(cache.lengths).max()) // 3)
    for policy, packed, bucket in CASES:
        overlong = OverlongConfig(max_length, policy)
        split = SplitConfig("train", 0.3, 5)
        if bucket:
            config = BatchingConfig.predictable(4 * max_length, (max_length // 2,), max_length, overlong=overlong,
                                                split=split)
        else:
            config = BatchingConfig(4 * max_length, (), max_length, pack=PackingConfig(max_length) if packed else None,
                                    overlong=overlong, split=split)
        plan = BatchPlanBuilder(cache, config).build(2)
        assert plan.epochs[0].stats["overlong"]["samples"] > 0  # the policy cut something
        name = f"{policy}-{'packed' if packed else 'rows'}"
        save_plan(plan, root / name)
        write_batches(root / name, root / f"{name}-batches", root / "store")
    return root


def loader_of(root, name: str, rank: int, world_size: int, workers: int = 0, **collator):
    plan = load_plan(root / name)
    sampler = PlanBatchSampler(plan, rank, world_size)
    batches = PackedBatchSampler(sampler) if plan.config.pack is not None else sampler
    return torch.utils.data.DataLoader(TokenDataset(root / "store"), batch_sampler=batches,
                                       collate_fn=PlanCollator(root / name, **collator), num_workers=workers)


@pytest.mark.parametrize("policy, packed, bucket", CASES)
@pytest.mark.parametrize("rank, world_size, workers", [(0, 1, 0), (1, 2, 2)])
def test_a_dataloader_cuts_what_collate_microbatch_and_batch_files_cut(world, policy, packed, bucket, rank,
                                                                        world_size, workers):
    name = f"{policy}-{'packed' if packed else 'rows'}"
    plan = load_plan(world / name)
    store = uc.batching.TokenStore.open(world / "store")
    files = BatchReader(world / f"{name}-batches")
    loader = loader_of(world, name, rank, world_size, workers)
    cut = 0
    for epoch, from_files in ((0, list(files.iter_epoch(0))), (1, list(files.iter_epoch(1)))):
        mine = [mb for mb in plan.iter_epoch(epoch) if mb.index % world_size == rank]
        got = list(loader)  # one pass is one epoch
        assert len(got) == len(mine) > 0
        for batch, mb in zip(got, mine):
            direct = collate_microbatch(store, mb)
            from_file = from_files[mb.index]
            for field in FIELDS:
                assert batch[field].dtype == torch.int32
                assert np.array_equal(batch[field].numpy(), getattr(direct, field)), (field, mb.index)
                assert np.array_equal(batch[field].numpy(), from_file[field]), (field, mb.index)
            assert batch["rows"].tolist() == mb.rows.tolist()
            cut += int(sum(stop - start < len(store.arrays(row)[0]) for row, (start, stop) in zip(mb.rows, mb.spans)))
    assert cut > 0  # some sample was taken as a range shorter than its row


@pytest.mark.parametrize("preset", ["hf", "padding_free"])
def test_every_preset_of_a_cut_plan_is_collate_microbatchs(world, preset):
    name = "truncate_left-packed"
    plan = load_plan(world / name)
    store = uc.batching.TokenStore.open(world / "store")
    got = list(loader_of(world, name, 0, 1, preset=preset))
    for batch, mb in zip(got, plan.iter_epoch(0)):
        # a packed plan's collator gives every microbatch the 4-D mask, even one whose rows hold one sequence each
        direct = collate_microbatch(store, mb, preset=preset, attention="4d" if preset == "hf" else "auto")
        assert batch.keys() == direct.keys()
        for key, value in direct.items():
            if isinstance(value, np.ndarray):
                assert batch[key].dtype == getattr(torch, value.dtype.name) and np.array_equal(batch[key].numpy(),
                                                                                                value), key
            else:
                assert batch[key] == value, key


def test_the_keys_carry_the_plans_ranges_and_a_whole_plan_keeps_its_rows(world, tmp_path):
    plan = load_plan(world / "split-rows")
    sampler = PlanBatchSampler(plan, 0, 1)
    for keys, mb in zip(sampler, plan.iter_epoch(0)):
        assert all(isinstance(key, PlanKey) and key.pack is None for key in keys)
        assert [(k.row, k.start, k.stop) for k in keys] == [(int(r), int(a), int(b)) for r, (a, b) in
                                                            zip(mb.rows, mb.spans)]
    packed = load_plan(world / "split-packed")
    for keys, mb in zip(PackedBatchSampler(PlanBatchSampler(packed, 0, 1)), packed.iter_epoch(0)):
        assert [key.pack for key in keys] == np.repeat(np.arange(len(mb.pack_sizes)), mb.pack_sizes).tolist()
    # a plan with a split alone (or skip) takes its samples whole: the items stay plain rows
    store = uc.batching.TokenStore.open(world / "store")
    whole = BatchPlanBuilder(store.length_cache(), BatchingConfig(4096, (), 1024, split=SplitConfig("train", 0.3, 5))
                             ).build(1)
    first = next(iter(PlanBatchSampler(whole, 0, 1)))
    assert first == whole.epochs[0].rows(0).tolist() and all(type(row) is int for row in first)


def test_a_whole_row_or_a_foreign_item_of_a_cut_plan_is_refused(world):
    store = uc.batching.TokenStore.open(world / "store")
    collator = PlanCollator(world / "truncate_right-rows")
    expect(errors.COLLATE_INPUT_INVALID, collator, [(0, *store.arrays(0))], mention="PlanKey")
    expect(errors.COLLATE_INPUT_INVALID, collator, [{"input_ids": [1]}], mention="TokenDataset items")
    longest = int(np.argmax(np.asarray(store.length_cache().lengths)))
    ids, _ = store.arrays(longest)
    dataset = TokenDataset(world / "store")
    expect(errors.COLLATE_INPUT_INVALID, collator, [dataset[PlanKey(longest, 0, len(ids) + 1)]],
           mention=f"row {longest} holds {len(ids)} tokens")


# ====================================================================== pairs
@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """A store of 40 preference records (prompt, then chosen = response, rejected = text), a plan of pairs and a
    packed one."""
    from batching_cases import train_tokenizer, write_model_dir
    from umlos_cuda.batching.tokens.writer import tokenize_dataset

    root = tmp_path_factory.mktemp("pairs")
    write_model_dir(root / "model", train_tokenizer(), {"eos_token": "</s>"})
    write_dataset(root / "prefs.jsonl", 40, seed=8)
    store = tokenize_dataset(root / "prefs.jsonl", root / "model", root / "store", prompt_field="prompt",
                             chosen_field="response", rejected_field="text")
    cache = store.length_cache()
    save_plan(BatchPlanBuilder(cache, BatchingConfig.predictable(1024, (32, 64), 256, group_size=2)).build(1),
              root / "plan")
    save_plan(BatchPlanBuilder(cache, BatchingConfig(1024, (), 256, group_size=2, pack=PackingConfig(256))).build(1),
              root / "packed")
    return root


@pytest.mark.parametrize("preset", ["shifted", "hf"])
def test_pairs_come_out_as_chosen_and_rejected_tensors(pairs, preset):
    plan = load_plan(pairs / "plan")
    store = uc.batching.TokenStore.open(pairs / "store")
    loader = torch.utils.data.DataLoader(TokenDataset(pairs / "store"), batch_sampler=PlanBatchSampler(plan, 0, 1),
                                         collate_fn=PlanCollator(plan, preset=preset, pairs=True), num_workers=1)
    got = list(loader)
    assert len(got) == len(plan.epochs[0]) > 1
    for batch, mb in zip(got, plan.iter_epoch(0)):
        sides = collate_preference_microbatch(store, mb)
        want = {f"{side}_{key}": value for side in ("chosen", "rejected")
                for key, value in apply_preset(getattr(sides, side), preset).items()}
        assert sorted(batch) == sorted(want) + (["rows"] if preset == "shifted" else [])
        for key, value in want.items():
            assert np.array_equal(batch[key].numpy(), value) and batch[key].dtype == getattr(torch, value.dtype.name)
        assert batch["chosen_input_ids"].shape == batch["rejected_input_ids"].shape == (len(mb.rows) // 2, mb.max_len)
        if preset == "shifted":
            assert batch["rows"].tolist() == mb.rows.tolist()
            assert np.array_equal(batch["chosen_input_ids"].numpy(), sides.as_dict()["chosen_input_ids"])


def test_pairs_are_refused_where_there_are_none(pairs, world):
    expect(errors.COLLATE_INPUT_INVALID, PlanCollator, world / "truncate_right-rows", pairs=True,
           mention="plan of preference pairs")
    expect(errors.COLLATE_INPUT_INVALID, PlanCollator, pairs / "packed", pairs=True, mention="packed row")
    store = uc.batching.TokenStore.open(pairs / "store")
    collator = PlanCollator(pairs / "plan", pairs=True)
    assert collator([(2, *store.arrays(2)), (3, *store.arrays(3))])["chosen_input_ids"].shape[0] == 1
    expect(errors.COLLATE_INPUT_INVALID, collator, [(3, *store.arrays(3)), (4, *store.arrays(4))],
           mention="rows 2p, 2p + 1")
    expect(errors.COLLATE_INPUT_INVALID, collator, [(2, *store.arrays(2))], mention="rows 2p, 2p + 1")
