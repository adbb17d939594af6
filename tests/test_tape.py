"""The trace tape (docs/checkpoint-format.md §10, IO.WriteTape_v1): one iter per
NextBatch call with cursors and replay token, a hash chain, blocks of
BLOCK_SIZE records, rotation at max_events, failure records with R8's
fields, and a reader that refuses every broken tape with its code."""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path

import numpy as np
import pytest

import umlos_cuda as uc
from umlos_cuda import errors
from umlos_cuda.checkpoint import CheckpointStore, open_store, read_tape, verify_store
from umlos_cuda.checkpoint import cbor_safe, tape, tape_fast
from umlos_cuda.checkpoint.tape import (
    BLOCK_SIZE,
    MAX_EVENTS,
    ZERO_HASH,
    failure_fields,
    frame,
    iter_fields,
    read_segment_bytes,
    record_hash,
)
from umlos_cuda.hashing import cbor_canonical, sha256
from test_checkpoint_support import DATASET, KEY, identity, manifest


def expect_code(code, function, *args, **kwargs):
    with pytest.raises(uc.UmlosError) as info:
        function(*args, **kwargs)
    assert info.value.code == code, f"expected {code}, got {info.value.code}: {info.value.message}"
    return info.value


def test_write_tape_constants():
    assert BLOCK_SIZE == 512 and MAX_EVENTS == 500_000


def records_of(store_dir):
    _, commits = open_store(store_dir)
    out = []
    read_tape(store_dir, [s for c in commits for s in c.trace["segments"]], on_record=lambda r, h: out.append((r, h)))
    return commits, out


def write_run(store_dir, steps, world_size=2, **options):
    m = manifest()
    cursor = uc.Cursor()
    batches = []
    with CheckpointStore.open(store_dir, identity(), KEY, **options) as store:
        root = store.start_run(DATASET, world_size=world_size)
        for t in range(1, steps + 1):
            for rank in range(world_size):
                batch = uc.next_batch(m, DATASET, world_size, rank, cursor=cursor, backend="numpy", t=t)
                store.tape.append(iter_fields(batch, t))
                batches.append(batch)
            cursor = batch.cursor
        store.tape.append({"type": "run_end", "status": "success", "final_epoch_count": cursor.epoch,
                           "total_samples_seen": 8 * steps, "checkpoint_hash": None, "restore_status": "none",
                           "final_cursors": {DATASET: cursor.to_dict()}})
        store.commit()
    return root, batches


def test_one_iter_per_call_with_cursors_and_replay_token(tmp_path):
    store_dir = str(tmp_path / "s")
    root, batches = write_run(store_dir, 5)
    commits, records = records_of(store_dir)
    assert records[0][0]["type"] == "run_header" and records[0][1] == root == commits[-1].trace["root_hash"]
    header = records[0][0]
    m = manifest()
    assert header["dataset_key"] == DATASET and header["cardinality"] == 1000 and header["sampler_block_size"] == 64
    assert header["is_shuffled_per_stage"] == {"train": True, "eval": False, "infer": False}
    assert header["replay_token"] == m.replay_token and header["manifest_hash"] == m.hash and header["world_size"] == 2
    iters = [r for r, _ in records if r["type"] == "iter"]
    assert len(iters) == len(batches) == 10
    for record, batch in zip(iters, batches):
        meta = batch.metadata
        assert record["cursor_before"] == meta["cursor_before"] and record["cursor_after"] == meta["cursor_after"]
        assert record["data_replay_t"].hex() == meta["data_replay_t"]
        assert record["sampler_config_hash"].hex() == meta["sampler_config_hash"]
        assert record["epoch_seed_hash"].hex() == meta["epoch_seed_hash"]
        assert record["effective_q"] == meta["effective_q"] == 8 / 1000
        assert record["rank"] == meta["rank"] and record["count"] == len(batch.indices)
        assert record["indices_sha256"] == sha256(np.asarray(batch.indices, dtype="<u8").tobytes())
    assert records[-1][0]["type"] == "run_end"
    # The chain: seq 0, 1, 2, ...; prev = hash of the previous record; tail = hash of the last.
    previous = ZERO_HASH
    for seq, (record, digest) in enumerate(records):
        assert record["seq"] == seq and record["prev"] == previous and digest == record_hash(record)
        previous = digest
    assert commits[-1].trace["tail_hash"] == previous and commits[-1].trace["ended"] is True


def test_blocks_and_rotation(tmp_path):
    store_dir = str(tmp_path / "s")
    write_run(store_dir, 20, block_size=3, max_events=7)  # 1 + 40 + 1 = 42 records
    commits, records = records_of(store_dir)
    segments = commits[-1].trace["segments"]
    assert [s["event_count"] for s in segments] == [7] * 6
    assert [s["first_seq"] for s in segments] == [0, 7, 14, 21, 28, 35]
    for segment in segments:
        data = Path(os.path.join(store_dir, segment["path"])).read_bytes()
        assert (len(data), sha256(data)) == (segment["size"], segment["sha256"])
        frames = split_frames(data)
        header = cbor_safe.decode(frames[0])
        assert header["block_size"] == 3 and header["max_events"] == 7
        blocks = [cbor_safe.decode(f) for f in frames[1:]]
        assert [len(b["records"]) for b in blocks] == [3, 3, 1]
        assert [b["block_index"] for b in blocks] == [0, 1, 2]
    assert len(records) == 42
    verify_store(store_dir)


def test_default_block_size_is_512(tmp_path):
    store_dir = str(tmp_path / "s")
    write_run(store_dir, 300)  # 1 + 600 + 1 records in one segment
    commits, _ = records_of(store_dir)
    segment = commits[-1].trace["segments"][0]
    frames = split_frames(Path(os.path.join(store_dir, segment["path"])).read_bytes())
    assert [len(cbor_safe.decode(f)["records"]) for f in frames[1:]] == [512, 90]


def split_frames(data):
    frames, position = [], 0
    while position < len(data):
        length = int.from_bytes(data[position:position + 4], "big")
        frames.append(data[position + 4:position + 4 + length])
        position += 4 + length
    return frames


def test_failure_record_carries_the_r8_fields(tmp_path):
    m = manifest()
    with pytest.raises(uc.UmlosError) as info:
        uc.next_batch(m, DATASET, 3, 0, cursor=uc.Cursor(0, 16), backend="numpy", t=12)  # 8 % 3 != 0
    exc = info.value
    store_dir = str(tmp_path / "s")
    with CheckpointStore.open(store_dir, identity(), KEY) as store:
        store.start_run(DATASET, world_size=3)
        store.tape.append(failure_fields(exc, replay_token=m.replay_token, rng_fingerprint_t=bytes([1]) * 32,
                                         state_fp_t=bytes([2]) * 32))
        store.commit()
    _, records = records_of(store_dir)
    failure = records[-1][0]
    assert failure["type"] == "failure"
    assert failure["t"] == 12 and failure["failure_code"] == errors.BATCH_SIZE_INCONSISTENT
    assert failure["failure_operator"] == "UML_OS.Data.NextBatch_v2" and failure["dataset_key"] == DATASET
    assert failure["data_replay_t"].hex() == exc.record["data_replay_t"]
    assert failure["replay_token"] == m.replay_token
    assert failure["rng_fingerprint_t"] == bytes([1]) * 32 and failure["state_fp_t"] == bytes([2]) * 32
    assert "divisible" in failure["diagnostics"]["message"]


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"type": "iter"}, "missing"),
        ({"type": "bogus"}, "unknown record type"),
        ({"type": "checkpoint", "t": 1, "commit_seq": 1, "extra": 1}, "unknown"),
        ({"type": "checkpoint", "t": -1, "commit_seq": 1}, "invalid t"),
        ({"type": "checkpoint", "t": True, "commit_seq": 1}, "invalid t"),
        ({"type": "restore", "t": 1, "checkpoint_hash": b"x", "restore_profile_id": "p", "cursors": {}}, "invalid"),
    ],
)
def test_writer_refuses_malformed_records(tmp_path, fields, message):
    with CheckpointStore.open(str(tmp_path / "s"), identity(), KEY) as store:
        store.start_run(DATASET, world_size=1)
        error = expect_code(errors.TRACE_FORMAT_INVALID, store.tape.append, fields)
        assert message in error.message
        assert store.tape.event_count == 1  # nothing was appended


def test_record_order(tmp_path):
    with CheckpointStore.open(str(tmp_path / "s"), identity(), KEY) as store:
        expect_code(errors.TRACE_FORMAT_INVALID, store.tape.append, {"type": "checkpoint", "t": 0, "commit_seq": 1})
        store.start_run(DATASET, world_size=1)
        expect_code(errors.TRACE_FORMAT_INVALID, store.start_run, DATASET, world_size=1)
        store.tape.append({"type": "run_end", "status": "failed", "final_epoch_count": 0, "total_samples_seen": 0,
                           "checkpoint_hash": None, "restore_status": "none", "final_cursors": {}})
        expect_code(errors.TRACE_FORMAT_INVALID, store.tape.append, {"type": "checkpoint", "t": 0, "commit_seq": 1})


# -- the reader, on hand-made segments ---------------------------------------------------


def run_header(seq=0, prev=ZERO_HASH):
    return {"type": "run_header", "seq": seq, "prev": prev, "schema_version": "UML_OS.IO.WriteTape_v1",
            "tenant_id": "t", "run_id": "r", "spec_version": "s", "replay_token": bytes(32), "manifest_hash": bytes(32),
            "dataset_key": "train", "cardinality": 10, "datasets": {"train": 10}, "sampler_block_size": 4,
            "is_shuffled_per_stage": {"train": True, "eval": False, "infer": False}, "world_size": 1,
            "backend_hash": bytes(32), "task_type": "x", "source_hash": None}


def checkpoint(seq, prev, t=1):
    return {"type": "checkpoint", "seq": seq, "prev": prev, "t": t, "commit_seq": 1}


def chain(n):
    records = [run_header()]
    for seq in range(1, n):
        records.append(checkpoint(seq, record_hash(records[-1]), t=seq))
    return records


def segment(blocks, *, index=1, first_seq=0, prev=ZERO_HASH, block_size=4, max_events=100):
    header = {"format": tape.TAPE_FORMAT, "segment_index": index, "first_seq": first_seq, "prev_hash": prev,
              "block_size": block_size, "max_events": max_events}
    data = frame(cbor_canonical(header))
    for i, records in enumerate(blocks):
        data += frame(cbor_canonical({"block_index": i, "records": records}))
    return data


def test_reader_accepts_a_good_segment():
    records = chain(6)
    assert read_segment_bytes(segment([records[:4], records[4:]])) == records


@pytest.mark.parametrize(
    "build, code",
    [
        (lambda r: segment([r[:4], r[4:]])[:-1], errors.TRACE_TRUNCATED),
        (lambda r: segment([r[:4], r[4:]])[:-40], errors.TRACE_TRUNCATED),
        (lambda r: segment([r[:4], r[4:]]) + b"\x00\x00", errors.TRACE_TRUNCATED),
        (lambda r: segment([r[:4], r[4:]]) + b"\xff\xff\xff\xff", errors.TRACE_FORMAT_INVALID),
        (lambda r: b"", errors.TRACE_TRUNCATED),
        (lambda r: segment([]), errors.TRACE_FORMAT_INVALID),
        (lambda r: segment([r[:5], r[5:]]), errors.TRACE_FORMAT_INVALID),  # block larger than block_size
        (lambda r: segment([r[:4], []]), errors.TRACE_FORMAT_INVALID),  # empty block
        (lambda r: segment([r[:2], r[3:]]), errors.TRACE_CHAIN_MISMATCH),  # a record missing
        (lambda r: segment([[r[0], r[2], r[1]]]), errors.TRACE_CHAIN_MISMATCH),  # reordered
        (lambda r: segment([r[1:4]]), errors.TRACE_CHAIN_MISMATCH),  # starts mid-chain
        (lambda r: segment([r[:4]], index=2), errors.TRACE_CHAIN_MISMATCH),
        (lambda r: segment([r[:4]], prev=b"\x01" * 32), errors.TRACE_CHAIN_MISMATCH),
        (lambda r: segment([r[:4], r[4:]], max_events=5), errors.TRACE_FORMAT_INVALID),
        (lambda r: segment([[r[0], dict(r[1], prev=b"\x00" * 32)]]), errors.TRACE_CHAIN_MISMATCH),
        (lambda r: segment([[r[0], dict(r[1], seq=5)]]), errors.TRACE_CHAIN_MISMATCH),
        (lambda r: segment([[r[0], dict(r[1], t="1")]]), errors.TRACE_FORMAT_INVALID),
        (lambda r: segment([[r[0], run_header(1, record_hash(r[0]))]]), errors.TRACE_FORMAT_INVALID),
        (lambda r: segment([[checkpoint(0, ZERO_HASH)]]), errors.TRACE_FORMAT_INVALID),
        (lambda r: frame(cbor_canonical({"format": "other"})), errors.TRACE_FORMAT_INVALID),
        (lambda r: frame(b"\xbf\xff"), errors.TRACE_FORMAT_INVALID),
    ],
)
def test_reader_refuses_broken_segments(build, code):
    expect_code(code, read_segment_bytes, build(chain(6)))


def test_every_byte_of_a_committed_tape_is_covered(tmp_path):
    store_dir = str(tmp_path / "s")
    write_run(store_dir, 1, world_size=1)
    commits, _ = records_of(store_dir)
    segments = [s for c in commits for s in c.trace["segments"]]
    path = os.path.join(store_dir, segments[0]["path"])
    original = Path(path).read_bytes()
    for position in range(len(original)):
        changed = bytearray(original)
        changed[position] ^= 0x41
        Path(path).write_bytes(changed)
        with pytest.raises(uc.UmlosError) as info:
            read_tape(store_dir, segments)
        assert info.value.code in (errors.TRACE_FORMAT_INVALID, errors.TRACE_CHAIN_MISMATCH, errors.TRACE_TRUNCATED)
    Path(path).write_bytes(original)
    verify_store(store_dir)
    print(f"\ntape byte changes: {len(original)} tried, {len(original)} detected")


def test_iter_fields_accepts_any_backend_output():
    m = manifest()
    batch = uc.next_batch(m, DATASET, 1, 0, backend="numpy")
    count, digest = tape.indices_digest(batch.indices)
    assert count == 8 and digest == hashlib.sha256(batch.indices.astype("<u8").tobytes()).digest()
    assert tape.indices_digest(np.array([], dtype=np.uint64)) == (0, sha256(b""))
    assert read_segment_bytes(io.BytesIO(b"").getvalue() or segment([chain(1)]))[0]["type"] == "run_header"


# -- the fast path (tape_fast): same records, same hashes, same errors -------------------


def iter_record(seq, prev, **overrides):
    record = {"type": "iter", "seq": seq, "prev": prev, "t": seq, "dataset_key": "train", "stage": "train",
              "epoch": seq // 3, "global_position": 8 * seq, "is_shuffled": True, "micro_batch_size": 8,
              "global_batch_size": 8, "subsampling_mode": "SHUFFLE_WITHOUT_REPLACEMENT",
              "sampling_mode": "SHUFFLE_WITHOUT_REPLACEMENT_BLOCK_AFFINE_V1", "sampler_config_hash": bytes([5]) * 32,
              "effective_q": 0.008, "epoch_seed_hash": bytes([6]) * 32, "data_replay_t": sha256(b"%d" % seq),
              "cursor_before": {"epoch": 0, "global_index": 8 * seq - 8},
              "cursor_after": {"epoch": 0, "global_index": 8 * seq},
              "world_size": 1, "rank": 0, "count": 8, "indices_sha256": sha256(b"i%d" % seq)}
    record.update(overrides)
    return record


def iter_chain(n, overrides=lambda seq: {}):
    """run_header, iter records 1..n-1 (a checkpoint record at 10)."""
    records = [run_header()]
    for seq in range(1, n):
        prev = record_hash(records[-1])
        records.append(checkpoint(seq, prev) if seq == 10 else iter_record(seq, prev, **overrides(seq)))
    return records


def iter_segment_bytes(records, block_size=4):
    return segment([records[i:i + block_size] for i in range(0, len(records), block_size)], block_size=block_size)


def outcome(data, fast):
    """What reading ``data`` yields: the records and hashes before any error, and the error."""
    got = []
    try:
        for record, digest in tape.iter_segment(io.BytesIO(data), "s", index=1, first_seq=0, prev_hash=ZERO_HASH,
                                                ended=False, fast=fast):
            got.append((record, digest))
    except uc.UmlosError as exc:
        return got, exc.code, exc.message
    return got, None, None


def test_block_matcher_proves_iter_and_checkpoint_blocks():
    records = iter_chain(13)
    frames = split_frames(iter_segment_bytes(records))
    matcher = tape._new_matcher()
    # Before it has seen the text and float values, the matcher leaves blocks to the strict reader.
    options = dict(block_size=4, room=100, max_depth=tape.MAX_RECORD_DEPTH, max_items=64 * 4 + 16)
    assert matcher.match_block(frames[2], block_index=1, seq=4, tail=record_hash(records[3]), **options) is None
    for record in records[1:4]:
        matcher.learn(record)
    for block_index, frame_bytes in enumerate(frames[2:], start=1):
        first = 4 * block_index
        hashes = matcher.match_block(frame_bytes, block_index=block_index, seq=first,
                                     tail=record_hash(records[first - 1]), **options)
        assert hashes == [record_hash(r) for r in records[first:first + 4]]
    assert matcher.fast_blocks == 3
    good = dict(block_index=1, seq=4, tail=record_hash(records[3]))
    refused = [
        (frames[2], dict(good, seq=5)),  # seq does not continue
        (frames[2], dict(good, tail=ZERO_HASH)),  # prev does not continue
        (frames[2], dict(good, block_index=2)),
        (frames[2] + b"\x00", good),  # trailing byte
        (frames[1], dict(block_index=0, seq=0, tail=ZERO_HASH)),  # the run_header block: strict reader
    ]
    for payload, where in refused:
        assert matcher.match_block(payload, **where, **options) is None, where
    assert matcher.match_block(frames[2], **good, **dict(options, room=3)) is None  # past max_events
    assert matcher.match_block(frames[2], **good, **dict(options, block_size=3)) is None
    assert matcher.match_block(frames[2], **good, **dict(options, max_depth=3)) is None
    # Values it has not seen (even valid ones) go to the strict reader.
    other = iter_chain(8, lambda seq: {"stage": "eval", "effective_q": 0.5} if seq >= 4 else {})
    other_frames = split_frames(iter_segment_bytes(other))
    assert matcher.match_block(other_frames[2], block_index=1, seq=4, tail=record_hash(other[3]), **options) is None


def test_uint_pattern_is_the_shortest_form_rule():
    """The uint pattern accepts exactly the heads the strict reader accepts as uint64."""
    import re

    pattern = re.compile(tape_fast._UINT, re.DOTALL)
    values = [0, 1, 23, 24, 255, 256, 65535, 65536, (1 << 32) - 1, 1 << 32, (1 << 64) - 1]
    tried = 0
    for value in values:
        for info, length in ((None, 0), (24, 1), (25, 2), (26, 4), (27, 8)):
            if info is None:
                if value >= 24:
                    continue
                data = bytes([value])
            else:
                if value >= 1 << (8 * length):
                    continue
                data = bytes([info]) + value.to_bytes(length, "big")
            try:
                strict = cbor_safe.decode(data) == value
            except uc.UmlosError:
                strict = False
            assert bool(pattern.fullmatch(data)) == strict == (data == cbor_canonical(value)), data.hex()
            tried += 1
    assert tried == 35  # every value in every head long enough to hold it


def test_fast_and_strict_readers_agree_on_good_tapes(tmp_path):
    records = iter_chain(13)
    data = iter_segment_bytes(records)
    assert outcome(data, True) == outcome(data, False) == ([(r, record_hash(r)) for r in records], None, None)
    store_dir = str(tmp_path / "s")
    write_run(store_dir, 30, block_size=5, max_events=17)
    _, commits = open_store(store_dir)
    segments = [s for c in commits for s in c.trace["segments"]]
    seen = {True: [], False: []}
    states = {fast: read_tape(store_dir, segments, on_record=lambda r, h, fast=fast: seen[fast].append((r, h)),
                              fast=fast) for fast in (True, False)}
    assert states[True] == states[False] and seen[True] == seen[False] and len(seen[True]) == 62
    cuts = {}
    read_tape(store_dir, segments, cuts={n: lambda h, n=n: cuts.setdefault(n, h) for n in (1, 17, 18, 62)})
    assert cuts == {n: seen[False][n - 1][1] for n in (1, 17, 18, 62)}


@pytest.mark.parametrize("mask", [0x01, 0x80])
def test_fast_and_strict_readers_agree_on_every_byte_change(mask):
    """Every changed byte of a tape whose later blocks take the fast path gives
    the same records before the failure, the same code and the same message."""
    data = iter_segment_bytes(iter_chain(13))
    frames = split_frames(data)
    start = len(frames[0]) + len(frames[1]) + 8  # from block 1 on: the blocks the fast path proves
    codes = {}
    for position in range(start, len(data)):
        changed = bytearray(data)
        changed[position] ^= mask
        fast, strict = outcome(bytes(changed), True), outcome(bytes(changed), False)
        assert fast == strict, position
        codes[strict[1]] = codes.get(strict[1], 0) + 1
    # Some changes stay valid here (a bit of the last record's hashes: no file digest to compare).
    assert set(codes) - {None} <= {errors.TRACE_FORMAT_INVALID, errors.TRACE_CHAIN_MISMATCH, errors.TRACE_TRUNCATED}
    assert codes[errors.TRACE_FORMAT_INVALID] and codes[errors.TRACE_CHAIN_MISMATCH]


@pytest.mark.parametrize(
    "overrides",
    [
        {"effective_q": float("nan")},
        {"effective_q": 1.5},  # a new float (f16)
        {"stage": "\u00e9val"},  # a new non-ASCII text
        {"stage": "x" * 1025},  # a text over the 1024 limit
        {"epoch": 1 << 64},  # a bignum tag
        {"rank": -1},
        {"is_shuffled": None},
        {"count": 2.0},
    ],
)
def test_fast_and_strict_readers_agree_on_bad_values(overrides):
    records = iter_chain(13, lambda seq: overrides if seq == 6 else {})
    assert outcome(iter_segment_bytes(records), True) == outcome(iter_segment_bytes(records), False)


def test_fast_and_strict_readers_agree_on_mutations():
    from hypothesis import HealthCheck, given, settings
    from test_fuzz_checkpoint import mutate, mutation

    good = iter_segment_bytes(iter_chain(13))

    @settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(mutation)
    def check(steps):
        changed = mutate(good, steps)
        assert outcome(changed, True) == outcome(changed, False)

    check()


END = dict(status="success", final_epoch_count=0, total_samples_seen=8, restore_status="none",
           final_cursors={DATASET: {"epoch": 0, "global_index": 8}})


def test_run_end_without_its_optional_fields_keeps_its_bytes():
    """Not giving task_type, world_size or backend_hash writes the record existing tapes hold."""
    legacy = {"type": "run_end", "status": "success", "final_epoch_count": 0, "total_samples_seen": 8,
              "checkpoint_hash": None, "restore_status": "none",
              "final_cursors": {DATASET: {"epoch": 0, "global_index": 8}}}
    assert cbor_canonical(tape.run_end_fields(**END)) == cbor_canonical(legacy)


def test_run_end_carries_task_type_world_size_and_backend_hash_when_given(tmp_path):
    store_dir = str(tmp_path / "s")
    ident = identity()
    with CheckpointStore.open(store_dir, ident, KEY) as store:
        store.start_run(DATASET, world_size=2)
        store.end_run(**END, task_type="data_loading", world_size=2, with_backend_hash=True)
        store.commit()
    _, records = records_of(store_dir)
    end = records[-1][0]
    assert end["type"] == "run_end" and end["task_type"] == "data_loading" and end["world_size"] == 2
    assert end["backend_hash"] == ident.backend_binary_hash == records[0][0]["backend_hash"]
    verify_store(store_dir)
    # Only the given fields are written.
    with CheckpointStore.open(str(tmp_path / "t"), identity(), KEY) as store:
        store.start_run(DATASET, world_size=1)
        store.end_run(**END, world_size=1)
        store.commit()
    end = records_of(str(tmp_path / "t"))[1][-1][0]
    assert end["world_size"] == 1 and "task_type" not in end and "backend_hash" not in end


@pytest.mark.parametrize("bad", [dict(task_type=""), dict(task_type=7), dict(world_size=0), dict(world_size=2 ** 32),
                                 dict(world_size=True), dict(with_backend_hash="yes")])
def test_end_run_refuses_invalid_optional_fields(tmp_path, bad):
    with CheckpointStore.open(str(tmp_path / "s"), identity(), KEY) as store:
        store.start_run(DATASET, world_size=1)
        expect_code(errors.CHECKPOINT_STATE_INVALID, store.end_run, **END, **bad)
        assert store.tape.ended is False


def test_run_end_optional_fields_are_checked_by_the_reader():
    record = {**tape.run_end_fields(**END, world_size=2), "seq": 1, "prev": ZERO_HASH}
    assert tape.check_record(record) is record
    expect_code(errors.TRACE_FORMAT_INVALID, tape.check_record, {**record, "world_size": -1})
    expect_code(errors.TRACE_FORMAT_INVALID, tape.check_record, {**record, "backend_hash": b"short"})
    # Optional fields are run_end's alone.
    iter_like = {"type": "checkpoint", "t": 1, "commit_seq": 1, "seq": 1, "prev": ZERO_HASH}
    expect_code(errors.TRACE_FORMAT_INVALID, tape.check_record, {**iter_like, "world_size": 2})
