"""The presets of docs/spec/nextbatch-v2.md §5. ``train_shuffle`` and ``eval_sequential`` are names for
the train and eval stages; ``streaming_infinite`` streams across epoch
boundaries (docs/nextbatch.md, "Presets"): each epoch is still a permutation,
it has its own sampling_mode and config hash, and it never drops. One sampler
resolution (``umlos_cuda.sampler.resolve_sampler``) turns a stage or preset and
a manifest into the sampler that calls report and checkpoints bind."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

import oracle
import umlos_cuda as uc
from nbcases import WORLD_SIZES, indices_list, raw_manifest
from umlos_cuda import errors
from umlos_cuda.checkpoint import RunIdentity
from umlos_cuda.presets import MODE_STREAMING
from umlos_cuda.sampler import SamplerConfig, resolve_sampler

STREAM = "streaming_infinite"


def test_preset_names():
    assert set(uc.PRESETS) == {"train_shuffle", "eval_sequential", "streaming_infinite"}
    assert MODE_STREAMING == oracle.MODE_STREAMING


@pytest.mark.parametrize("preset,stage", [("train_shuffle", "train"), ("eval_sequential", "eval")])
def test_named_presets_equal_their_stage(preset, stage):
    raw = raw_manifest(500, 32, 24, seed=1)
    for gi in (0, 24, 480):
        a = uc.next_batch(raw, "train", 3, 1, "infer", uc.Cursor(2, gi), backend="numpy", preset=preset)  # preset wins
        b = uc.next_batch(raw, "train", 3, 1, stage, uc.Cursor(2, gi), backend="numpy")
        assert indices_list(a) == indices_list(b)
        assert a.cursor == b.cursor
        assert a.metadata["sampler_config_hash"] == b.metadata["sampler_config_hash"]
        assert a.metadata["preset"] == preset


def stream(raw, world_size, cursor, steps):
    out, cursors = [], []
    for _ in range(steps):
        after = None
        for rank in range(world_size):
            batch = uc.next_batch(raw, "train", world_size, rank, "train", cursor, backend="numpy", preset=STREAM)
            out.extend(indices_list(batch))
            assert after is None or after == batch.cursor
            after = batch.cursor
        cursors.append(after)
        cursor = after
    return out, cursors


@pytest.mark.parametrize("drop_last", [False, True])
def test_stream_is_the_concatenation_of_epochs(drop_last):
    n, g = 100, 24
    raw = raw_manifest(n, 16, g, seed=5, drop_last=drop_last)
    sequence, cursors = stream(raw, 4, uc.Cursor(3, 0), 25)  # 600 positions = 6 epochs
    epochs = [indices_list(uc.epoch_indices(raw_manifest(n, 16, g, seed=5, drop_last=False), "train", epoch=e,
                                            backend="numpy"))
              for e in range(3, 9)]
    if not drop_last:
        assert sequence == [i for e in epochs for i in e]
    for k in range(6):  # each epoch of the stream is a permutation: nothing dropped, nothing repeated
        assert sorted(sequence[k * n : (k + 1) * n]) == list(range(n))
    assert cursors[-1] == uc.Cursor(9, 0)
    assert cursors[3] == uc.Cursor(3, 96) and cursors[4] == uc.Cursor(4, 20)  # carried across the boundary
    model = oracle.Oracle(raw)
    assert sequence[:n] == model.epoch("train", 3).window(0, n)


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_stream_is_world_size_independent(world_size):
    raw = raw_manifest(61, 8, 24, seed=2)
    reference, ref_cursors = stream(raw, 1, uc.Cursor(0, 50), 10)
    got, cursors = stream(raw, world_size, uc.Cursor(0, 50), 10)
    assert got == reference and cursors == ref_cursors


def test_stream_batch_larger_than_an_epoch():
    """G > N: one global batch spans several epochs, each a permutation."""
    raw = raw_manifest(10, 3, 48, seed=9, drop_last=True)  # drop_last does not apply to the stream
    batch = uc.next_batch(raw, "train", 1, 0, "train", uc.Cursor(0, 7), backend="numpy", preset=STREAM)
    got = indices_list(batch)
    assert len(got) == 48
    assert batch.cursor == uc.Cursor(5, 5)  # (7 + 48) = 5*10 + 5
    assert sorted(got[3:13]) == list(range(10))  # epoch 1 complete
    expected = oracle.Oracle(raw).next_batch("train", 1, 0, "train", 0, 7, streaming=True)
    assert got == expected.indices


def test_stream_metadata_has_its_own_mode_and_hash():
    raw = raw_manifest(100, 16, 24, drop_last=True)
    meta = uc.next_batch(raw, "train", 1, 0, "train", uc.Cursor(0, 0), backend="numpy", preset=STREAM).metadata
    train = uc.next_batch(raw, "train", 1, 0, "train", uc.Cursor(0, 0), backend="numpy").metadata
    assert meta["sampling_mode"] == "STREAMING_SHUFFLE_BLOCK_AFFINE_V1"
    assert meta["sampler_config_hash"] == oracle.sampler_config_hash(MODE_STREAMING, 16, False).hex()
    assert meta["sampler_config_hash"] != train["sampler_config_hash"]
    assert train["sampler_config_hash"] == oracle.sampler_config_hash(oracle.MODE_SHUFFLE, 16, True).hex()
    assert meta["is_shuffled"] is True


def test_stream_refuses_a_cursor_past_n():
    with pytest.raises(uc.UmlosError) as info:
        uc.next_batch(raw_manifest(100, 16, 24), "train", 1, 0, "train", uc.Cursor(0, 100), backend="numpy",
                      preset=STREAM)
    assert info.value.code == errors.GLOBAL_POSITION_EXCEEDS_CARDINALITY


@settings(max_examples=100)
@given(n=st.integers(1, 300), block_size=st.integers(1, 64), g_per=st.integers(1, 40),
       world_size=st.sampled_from(WORLD_SIZES), seed=st.integers(0, 2**64 - 1), data=st.data())
def test_stream_matches_oracle(n, block_size, g_per, world_size, seed, data):
    g = g_per * world_size
    raw = raw_manifest(n, block_size, g, seed=seed)
    gi = data.draw(st.integers(0, n - 1))
    epoch = data.draw(st.integers(0, 1000))
    rank = data.draw(st.integers(0, world_size - 1))
    batch = uc.next_batch(raw, "train", world_size, rank, "train", uc.Cursor(epoch, gi), backend="numpy", preset=STREAM)
    expected = oracle.Oracle(raw).next_batch("train", world_size, rank, "train", epoch, gi, streaming=True)
    assert indices_list(batch) == expected.indices
    assert (batch.cursor.epoch, batch.cursor.global_index) == expected.cursor
    assert batch.metadata["sampler_config_hash"] == expected.sampler_config_hash
    assert batch.metadata["data_replay_t"] == expected.data_replay_t


# (stage, preset) -> (stage, sampling_mode, streaming) the sampler resolves to.
RESOLUTIONS = [
    ("train", None, "train", oracle.MODE_SHUFFLE, False),
    ("eval", None, "eval", oracle.MODE_SEQUENTIAL, False),
    ("infer", None, "infer", oracle.MODE_SEQUENTIAL, False),
    ("infer", "train_shuffle", "train", oracle.MODE_SHUFFLE, False),
    ("train", "eval_sequential", "eval", oracle.MODE_SEQUENTIAL, False),
    ("eval", "streaming_infinite", "train", oracle.MODE_STREAMING, True),
]


@pytest.mark.parametrize("stage,preset,want_stage,want_mode,streaming", RESOLUTIONS)
@pytest.mark.parametrize("drop_last", [False, True])
def test_one_sampler_resolution_for_calls_and_checkpoints(stage, preset, want_stage, want_mode, streaming, drop_last):
    manifest = uc.Manifest.from_dict(raw_manifest(100, 16, 24, drop_last=drop_last))
    sampler = resolve_sampler(manifest, stage, preset)
    assert isinstance(sampler, SamplerConfig) and not hasattr(sampler, "__dict__")  # frozen and slotted
    with pytest.raises(AttributeError):
        sampler.drop_last = not sampler.drop_last
    want_drop_last = drop_last and not streaming
    assert (sampler.stage, sampler.preset, sampler.streaming) == (want_stage, preset, streaming)
    assert (sampler.sampling_mode, sampler.drop_last, sampler.block_size) == (want_mode, want_drop_last, 16)
    assert sampler.shuffled is (want_stage == "train")
    assert sampler.config_hash == oracle.sampler_config_hash(want_mode, 16, want_drop_last)
    meta = uc.next_batch(manifest, "train", 1, 0, stage, uc.Cursor(0, 0), backend="numpy", preset=preset).metadata
    assert (meta["stage"], meta["preset"], meta["sampling_mode"], meta["drop_last"]) == (
        sampler.stage, sampler.preset, sampler.sampling_mode, sampler.drop_last,
    )  # fmt: skip
    assert meta["sampler_config_hash"] == sampler.config_hash.hex()
    assert RunIdentity("tenant", "run", manifest, stage=stage, preset=preset).sampler_config_hash == sampler.config_hash


@pytest.mark.parametrize("stage,preset,message", [
    ("training", None, "stage 'training' is not one of train, eval, infer"),
    (None, None, "stage None is not one of train, eval, infer"),
    ("train", "streaming", "unknown preset 'streaming'; choose one of train_shuffle, eval_sequential, "
                           "streaming_infinite"),
])  # fmt: skip
def test_bad_stages_and_presets_name_the_allowed_values(stage, preset, message):
    manifest = uc.Manifest.from_dict(raw_manifest(100))
    with pytest.raises(uc.UmlosError) as info:
        resolve_sampler(manifest, stage, preset)
    assert (info.value.code, info.value.message) == (errors.INVALID_STAGE_TYPE, message)
    with pytest.raises(uc.UmlosError) as info:
        uc.next_batch(manifest, "train", 1, 0, stage, backend="numpy", preset=preset)
    assert (info.value.code, info.value.message) == (errors.INVALID_STAGE_TYPE, message)
