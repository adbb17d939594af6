"""Rolling plan windows: the window log, offline replay that proves every
fingerprint (and catches a changed token, a changed fingerprint, a torn or
foreign log), checkpoints through the store with the ``plan_window`` kind,
resume equal to the uninterrupted run, the CLI, the plot, and the
documentation of the failure codes."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from itertools import pairwise
from pathlib import Path

import pytest

import umlos_cuda as uc
from umlos_cuda import cli, errors
from umlos_cuda.batching import BatchingConfig
from umlos_cuda.checkpoint import CheckpointState, CheckpointStore, cursor_kinds, restore_latest, verify_store
from umlos_cuda.streams import (MockGymStream, ReplayBuffer, RollingBatchPlanWindow, WindowCheckpoint,
                                plot_curriculum, policies_from_yaml, read_log, replay_log)
from streams_support import expect
from test_checkpoint_support import DATASET, KEY, identity

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
POLICY = "policies:\n  - type: failure_replay\n    failure_weight: 3.0\n  - type: novelty\n    novelty_window: 60\n"
BATCHING = BatchingConfig.throughput(2048, (128, 256, 512), 1024)
SAMPLES = list(MockGymStream(240, seed=5, max_length=700))



def builder(log=None, eviction="reservoir"):
    buffer = ReplayBuffer(80, eviction, manifest=identity().manifest, priority_exponent=0.5)
    return RollingBatchPlanWindow(buffer, 6, batching=BATCHING, policy=policies_from_yaml(POLICY),
                                  samples_per_window=50, log=log)


def feed(window, samples, every=20, on_window=None):
    out = []
    for s in samples:
        window.add(s, 1.0 + (s.seq % 4))
        if (window.buffer.added) % every == 0:
            out.append(window.next_window())
            if on_window is not None:
                on_window(window)
    return out


def test_a_recorded_run_replays_bit_for_bit(tmp_path):
    log = tmp_path / "windows.jsonl"
    windows = feed(builder(log), SAMPLES)
    contents = read_log(log)
    assert len(contents.windows) == len(windows) == 12
    assert [w["window_fingerprint"] for w in contents.windows] == [w.fingerprint for w in windows]
    assert sum(len(w["added"]) for w in contents.windows) == 240
    assert all(1 <= len(w.microbatches) <= 6 for w in windows)
    report = replay_log(log)
    assert report.windows == 12 and report.samples == 240 and report.last_window_fingerprint == windows[-1].fingerprint
    # every microbatch holds snapshot samples and respects the token budget
    for w in windows:
        for mb in w.microbatches:
            assert len(mb) * max(s.length for s in mb) <= BATCHING.token_budget


def tamper(path, window, change):
    lines = path.read_text().splitlines()
    record = json.loads(lines[window + 1])
    change(record)
    lines[window + 1] = json.dumps(record)
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("change,mention", [
    (lambda r: r["added"][0]["sample"]["input_ids"].__setitem__(0, 7), "snapshot_fingerprint"),
    (lambda r: r["added"][0].__setitem__("priority", 9.0), "snapshot_fingerprint"),
    (lambda r: r.__setitem__("plan_fingerprint", "0" * 64), "plan_fingerprint"),
    (lambda r: r.__setitem__("window_fingerprint", "0" * 64), "window_fingerprint"),
    (lambda r: r["rng_offsets"].__setitem__("policy", 1), "rng_offsets"),
])
def test_replay_names_what_differs(tmp_path, change, mention):
    log = tmp_path / "windows.jsonl"
    feed(builder(log), SAMPLES[:100])
    tamper(log, 3, change)
    expect(errors.WINDOW_REPLAY_MISMATCH, replay_log, log, mention=f"window 3: the rebuilt {mention}")


def test_a_torn_or_foreign_log_is_refused(tmp_path):
    log = tmp_path / "windows.jsonl"
    feed(builder(log), SAMPLES[:60])
    text = log.read_bytes()
    (tmp_path / "torn.jsonl").write_bytes(text + b'{"kind": "window", "win')
    expect(errors.WINDOW_LOG_INVALID, replay_log, tmp_path / "torn.jsonl", mention="torn")
    (tmp_path / "foreign.jsonl").write_bytes(b'{"kind": "header", "format": "other"}\n')
    expect(errors.WINDOW_LOG_INVALID, replay_log, tmp_path / "foreign.jsonl", mention="header")
    lines = text.splitlines(keepends=True)
    (tmp_path / "gap.jsonl").write_bytes(lines[0] + lines[2])
    expect(errors.WINDOW_LOG_INVALID, replay_log, tmp_path / "gap.jsonl", mention="should be window 0")
    expect(errors.WINDOW_LOG_INVALID, replay_log, tmp_path / "missing.jsonl", mention="cannot read")
    expect(errors.WINDOW_LOG_INVALID, builder, log, mention="exists")


def test_checkpoints_are_taken_between_windows():
    window = builder()
    window.add(SAMPLES[0])
    expect(errors.REPLAY_BUFFER_INVALID, window.state_dict, mention="since the last window")
    window.next_window()
    assert window.state_dict()["windows"] == 1
    expect(errors.REPLAY_BUFFER_INVALID, RollingBatchPlanWindow(ReplayBuffer(3)).next_window, mention="empty")


def test_restored_windows_equal_the_uninterrupted_run(tmp_path):
    """Run B commits a checkpoint after each window through the store, stops
    after window 4 with 7 samples pending and a torn line in its log; resumed
    from the store and its log, it builds the same 12 windows as run A."""
    reference = feed(builder(tmp_path / "a.jsonl"), SAMPLES)
    store_dir = str(tmp_path / "store")
    log_b = tmp_path / "b.jsonl"
    window = builder(log_b)
    with CheckpointStore.open(store_dir, identity(), KEY) as store:
        store.start_run(DATASET, world_size=1)

        def commit(w):
            store.commit(CheckpointState(w.index, {DATASET: uc.Cursor()}, extra_cursors={"plan_window": w}))

        feed(window, SAMPLES[:107], on_window=commit)  # windows 0..4 committed, 7 samples pending (lost)
    with open(log_b, "ab") as handle:
        handle.write(b'{"kind":"window","window":5,"added":[')  # a crash inside the next append
    assert "plan_window" in cursor_kinds() and verify_store(store_dir)["checkpoints"] == 5
    saved = restore_latest(store_dir, identity()).extra_cursors["plan_window"]
    assert isinstance(saved, WindowCheckpoint) and saved.windows == 5
    resumed = saved.resume(log_b)
    assert resumed.buffer.added == 100
    rest = feed(resumed, SAMPLES[100:])
    assert [w.fingerprint for w in rest] == [w.fingerprint for w in reference[5:]]
    assert [w["window_fingerprint"] for w in read_log(log_b).windows] == [w.fingerprint for w in reference]
    assert replay_log(log_b).windows == 12


def test_resume_refuses_a_log_shorter_than_the_checkpoint(tmp_path):
    window = builder(tmp_path / "w.jsonl")
    feed(window, SAMPLES[:60])
    state = window.state_dict()
    short = builder(tmp_path / "short.jsonl")
    feed(short, SAMPLES[:20])
    expect(errors.WINDOW_LOG_INVALID, RollingBatchPlanWindow.resume, state, tmp_path / "short.jsonl",
           mention="holds 1 windows")
    expect(errors.REPLAY_BUFFER_INVALID, RollingBatchPlanWindow.resume, {**state, "windows": -1}, tmp_path / "w.jsonl")


def test_cli_replay(tmp_path, capsys):
    log = tmp_path / "run" / "windows.jsonl"
    feed(builder(log), SAMPLES[:80])
    assert cli.main(["gym", "replay", str(tmp_path / "run")]) == 0
    assert "replayed 4 windows (80 samples" in capsys.readouterr().out
    tamper(log, 1, lambda r: r.__setitem__("plan_fingerprint", "1" * 64))
    assert cli.main(["gym", "replay", str(log)]) == 2
    assert "error WINDOW_REPLAY_MISMATCH: window 1" in capsys.readouterr().err


def test_the_plot(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed (the optional 'plot' extra)")
    log = tmp_path / "windows.jsonl"
    feed(builder(log), SAMPLES[:80])
    png = plot_curriculum(log, tmp_path / "curriculum.png")
    with open(png, "rb") as handle:
        assert handle.read(8) == b"\x89PNG\r\n\x1a\n"


def test_every_streams_code_is_documented():
    source = Path(os.path.join(ROOT, "umlos_cuda", "errors.py")).read_text(encoding="utf-8")
    block = source.split("#: Online streams, replay buffers", 1)[1].split("\n\n", 1)[0]
    codes = set(re.findall(r'^([A-Z_]+) = "\1"', block, re.M))
    assert len(codes) == 9
    doc = Path(os.path.join(ROOT, "docs", "streams.md")).read_text(encoding="utf-8")
    table = doc.split("## Failure codes", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"^\| `([A-Z_]+)` \|", table, re.M))
    assert codes <= documented, sorted(codes - documented)
    defined = {value for name, value in vars(errors).items() if name.isupper() and isinstance(value, str)}
    assert documented <= defined, sorted(documented - defined)


def test_packed_windows_record_their_packing_and_replay_bit_for_bit(tmp_path):
    """Windows over a packed configuration build packed plans; the log's header
    records the pack configuration, so replay rebuilds the same windows."""
    from umlos_cuda.batching import PackingConfig

    pack = PackingConfig(max_length=1024)
    log = tmp_path / "windows.jsonl"
    buffer = ReplayBuffer(80, "reservoir", manifest=identity().manifest, priority_exponent=0.5)
    window = RollingBatchPlanWindow(buffer, 6, batching=BATCHING, pack=pack, log=log)
    assert window.batching.pack == pack and window.batching.rows_per_microbatch == 2
    windows = feed(window, SAMPLES)
    assert read_log(log).header["pack"] == pack.to_dict()
    for w in windows:
        assert w.plan.config.pack == pack and w.pack_sizes is not None and len(w.pack_sizes) == len(w.microbatches)
        for mb, sizes in zip(w.microbatches, w.pack_sizes):
            assert sum(sizes) == len(mb) and len(sizes) <= 2
            starts = [sum(sizes[:i]) for i in range(len(sizes) + 1)]
            for a, b in pairwise(starts):  # every packed row fits max_length
                assert sum(s.length for s in mb[a:b]) <= pack.max_length
    # Packing puts several samples in a row: fewer, fuller microbatches than the unpacked run.
    assert any(max(sizes) > 1 for w in windows for sizes in w.pack_sizes)
    report = replay_log(log)
    assert report.windows == len(windows) and report.last_window_fingerprint == windows[-1].fingerprint
    # The same run through a BatchingConfig that carries the pack is the same run.
    other = tmp_path / "other.jsonl"
    other_buffer = ReplayBuffer(80, "reservoir", manifest=identity().manifest, priority_exponent=0.5)
    batching = dataclasses.replace(BATCHING, pack=pack)
    same = feed(RollingBatchPlanWindow(other_buffer, 6, batching=batching, log=other), SAMPLES)
    assert [w.fingerprint for w in same] == [w.fingerprint for w in windows]
    assert replay_log(other).last_window_fingerprint == windows[-1].fingerprint


def test_unpacked_windows_keep_their_log_header():
    window = builder()
    assert "pack" not in window.header() and window.batching.pack is None
