"""The RNG state and fingerprints in checkpoints and on the tape (umlos_cuda.rng.checkpoint_kinds):
saved, verified and restored through the checkpoint store to identical draws,
also after the writer is killed with SIGKILL at any step of a commit; the
``rng.iter`` and violation records pass the tape reader; a reader in another
process finds the kinds through the package's entry point."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

import umlos_cuda as uc
from umlos_cuda import errors
from umlos_cuda.rng import checkpoint_kinds as rng_checkpoint
from umlos_cuda.checkpoint import CheckpointState, CheckpointStore, atomic, open_store, restore_latest, verify_store
from umlos_cuda.checkpoint.tape import iter_fields, read_tape
from umlos_cuda.rng.nextbatch_v1 import next_batch_v1
from umlos_cuda.rng.streams import RngStreams, consumes
from test_checkpoint_crash import kill_hook
from test_checkpoint_support import DATASET, KEY, identity

STEPS = 5
#: Steps of the killed runs: every crash point of 3 commits (about 17 each).
CRASH_STEPS = 3


class Trainer:
    """A run's RNG use per step: Encode (2 init), NextBatch_v1 (1 misc), and a
    k-means (31 cluster) every third step, each a declared operator."""

    def __init__(self, streams: RngStreams) -> None:
        self.streams = streams
        self.encode = consumes(streams, "init", 2, operator="test.Encode_v1")(lambda: streams.draw("init", 2))
        self.kmeans = consumes(streams, "cluster", 31, operator="test.KMeans_v1")(lambda: streams.draw("cluster", 31))

    def step(self, t: int) -> None:
        self.streams.accountant.attach(t=t)
        self.encode()
        next_batch_v1(identity().manifest, DATASET, 2, 1, t // 3, streams=self.streams, backend="numpy")
        if t % 3 == 0:
            self.kmeans()


def reference_states(steps: int) -> list[dict]:
    """``state_dict()`` after 0, 1, ..., ``steps`` steps of an uninterrupted run."""
    streams = RngStreams.from_manifest(identity().manifest)
    trainer = Trainer(streams)
    out = [streams.state_dict()]
    for t in range(1, steps + 1):
        trainer.step(t)
        out.append(streams.state_dict())
    return out


def run(store_dir: str, steps: int = STEPS) -> None:
    """Open (recovering), restore the RNG state or start, then step and commit."""
    ident = identity()
    streams = RngStreams.from_manifest(ident.manifest)
    trainer = Trainer(streams)
    with CheckpointStore.open(store_dir, ident, KEY) as store:
        streams.accountant.attach(store.tape)
        restored = store.restore_latest()
        if restored is None:
            store.start_run(DATASET, world_size=1)
            t, cursor = 0, uc.Cursor()
        else:
            t, cursor = restored.t, restored.cursors[DATASET]
            streams.load_state_dict(restored.extra_cursors["rng"])
        while t < steps:
            t += 1
            trainer.step(t)
            batch = uc.next_batch(ident.manifest, DATASET, 1, 0, cursor=cursor, backend="numpy", t=t)
            cursor = batch.cursor
            store.tape.append(iter_fields(batch, t))
            store.tape.append(rng_checkpoint.step_record(streams, t))
            store.commit(CheckpointState(t, {DATASET: cursor}, extra_cursors={
                "rng": streams, "fingerprints": rng_checkpoint.fingerprints(streams)}))


def tape_records(store_dir: str) -> list[dict]:
    _, commits = open_store(store_dir)
    out: list[dict] = []
    read_tape(store_dir, [s for c in commits for s in c.trace["segments"]], on_record=lambda r, h: out.append(r),
              fast=False)
    return out


def test_the_state_round_trips_through_the_store(tmp_path):
    store_dir = str(tmp_path / "store")
    run(store_dir)
    assert verify_store(store_dir)["checkpoints"] == STEPS
    reference = reference_states(STEPS + 3)
    restored = restore_latest(store_dir, identity())
    assert restored.extra_cursors["rng"] == reference[STEPS]
    streams = RngStreams.from_manifest(identity().manifest)
    streams.load_state_dict(restored.extra_cursors["rng"])
    assert streams.fingerprint() == restored.extra_cursors["fingerprints"]["rng_fingerprint"]
    Trainer(streams).step(STEPS + 1)
    assert streams.state_dict() == reference[STEPS + 1]
    steps = [r for r in tape_records(store_dir) if r["type"] == "rng.iter"]
    assert [r["t"] for r in steps] == list(range(1, STEPS + 1))
    check = RngStreams.from_manifest(identity().manifest)
    for record in steps:
        check.load_state_dict(reference[record["t"]])
        assert record["rng_fingerprint_t"] == check.fingerprint()
        assert len(record["state_fp_t"]) == 32 and record["functional_fp"] is None


def test_a_run_resumes_where_it_stopped(tmp_path):
    store_dir = str(tmp_path / "store")
    run(store_dir, steps=2)
    run(store_dir, steps=STEPS)  # restores t = 2 and the RNG state, steps on
    restored = restore_latest(store_dir, identity())
    assert restored.t == STEPS and restored.extra_cursors["rng"] == reference_states(STEPS)[STEPS]


def fork_run(store_dir: str, kill_at: int) -> int:
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        try:
            atomic.crash_hook = kill_hook(kill_at, None)
            run(store_dir, CRASH_STEPS)
            os._exit(0)
        except BaseException:
            os._exit(3)
    _, status = os.waitpid(pid, 0)
    return status


@pytest.mark.skipif(not hasattr(os, "fork"), reason="the writer is a forked process")
def test_sigkill_at_every_step_of_a_commit_restores_to_identical_draws(tmp_path):
    """The writer kills itself (SIGKILL) at the k-th crash point of its run, for
    every k until a run completes. The latest committed checkpoint holds the
    RNG state of its step, the draws after restoring it are the uninterrupted
    run's, and a writer that reopens the store finishes the run with the
    uninterrupted run's final state."""
    reference = reference_states(CRASH_STEPS + 1)
    kills = restores = 0
    for kill_at in range(200):
        store_dir = str(tmp_path / f"store{kill_at}")
        status = fork_run(store_dir, kill_at)
        if os.WIFEXITED(status):
            assert os.WEXITSTATUS(status) == 0
            break
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        kills += 1
        try:
            restored = restore_latest(store_dir, identity())  # a full restore verifies every byte first
        except uc.UmlosError as exc:  # killed before the store existed
            assert exc.code == errors.CHECKPOINT_NOT_FOUND
            restored = None
        if restored is not None:
            saved = restored.extra_cursors["rng"]
            assert saved == reference[restored.t]
            streams = RngStreams.from_manifest(identity().manifest)
            streams.load_state_dict(saved)
            Trainer(streams).step(restored.t + 1)
            assert streams.state_dict() == reference[restored.t + 1]
            restores += 1
        run(store_dir, CRASH_STEPS)  # recovery, restore, finish
        final = restore_latest(store_dir, identity())
        assert final.t == CRASH_STEPS and final.extra_cursors["rng"] == reference[CRASH_STEPS]
    else:
        raise AssertionError("the run never completed")
    assert kills >= 5 * CRASH_STEPS and restores >= kills // 2  # several crash points per commit; most after one
    print(f"{kills} kills, {restores} restores checked")


def test_a_violation_on_the_store_tape_passes_the_reader(tmp_path):
    store_dir = str(tmp_path / "store")
    ident = identity()
    streams = RngStreams.from_manifest(ident.manifest)
    with CheckpointStore.open(store_dir, ident, KEY) as store:
        store.start_run(DATASET, world_size=1)
        streams.accountant.attach(store.tape, t=1)
        with pytest.raises(uc.UmlosError) as info, consumes(streams, "misc", 1, operator="test.Violates_v1"):
            streams.draw("misc", 2)
        assert info.value.code == errors.RNG_CONSUMPTION_VIOLATION
        store.commit()
    verify_store(store_dir)
    failure = next(r for r in tape_records(store_dir) if r["type"] == "failure")
    assert failure["failure_operator"] == "test.Violates_v1" and failure["rng_fingerprint_t"] == streams.fingerprint()
    assert (failure["diagnostics"]["expected_misc"], failure["diagnostics"]["actual_misc"]) == (1, 2)


def test_bad_states_are_refused_before_anything_is_written(tmp_path):
    store_dir = str(tmp_path / "store")
    ident = identity()
    with CheckpointStore.open(store_dir, ident, KEY) as store:
        store.start_run(DATASET, world_size=1)
        for extra in ({"rng": {"format": "x"}}, {"fingerprints": {"state_fp": b"1"}},
                      {"fingerprints": {"rng_fingerprint": None, "state_fp": b"1", "functional_fp": None}}):
            with pytest.raises(uc.UmlosError) as info:
                store.commit(CheckpointState(1, {DATASET: uc.Cursor()}, extra_cursors=extra))
            assert info.value.code == errors.CHECKPOINT_STATE_INVALID
        store.commit(CheckpointState(1, {DATASET: uc.Cursor()}))
    assert verify_store(store_dir)["checkpoints"] == 1


def test_step_records_carry_a_given_functional_fp():
    streams = RngStreams.from_manifest(identity().manifest)
    fp = uc.functional_fp(0.5, 0.25, "binary", identity().manifest.spec_version)
    record = rng_checkpoint.step_record(streams, 50, functional_fp=fp)
    assert record["functional_fp"] == fp and record["type"] == "rng.iter"
    assert rng_checkpoint.fingerprints(streams, functional_fp=fp)["functional_fp"] == fp
    for bad in (fp.hex(), b"short"):
        with pytest.raises(uc.UmlosError) as info:
            rng_checkpoint.step_record(streams, 50, functional_fp=bad)
        assert info.value.code == errors.FINGERPRINT_INPUT_INVALID
    with pytest.raises(uc.UmlosError):
        rng_checkpoint.step_record(streams, -1)


def test_verify_in_a_fresh_process_finds_the_kinds_through_the_entry_point(tmp_path):
    store_dir = str(tmp_path / "store")
    run(store_dir, steps=2)
    script = os.path.join(os.path.dirname(sys.executable), "umlos-cuda")
    command = [script] if os.path.exists(script) else [sys.executable, "-m", "umlos_cuda.cli"]
    done = subprocess.run(command + ["checkpoint", "verify", store_dir], capture_output=True, text=True,
                          cwd=str(tmp_path), timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("OK store")
    probe = ("import sys; import umlos_cuda.checkpoint.tape as t; t.record_schema('rng.iter'); "
             "print(sorted(sys.modules).count('umlos_cuda.rng.checkpoint_kinds'))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=str(tmp_path), timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "1", done.stderr


def test_the_saved_state_is_exactly_the_state_dict():
    streams = RngStreams.from_manifest(identity().manifest)
    streams.draw("cluster", 3)
    assert rng_checkpoint.RNG.encode(streams) == streams.state_dict()
    assert rng_checkpoint.RNG.decode(streams.state_dict(), identity().manifest) == streams.state_dict()
    with pytest.raises(uc.UmlosError):
        rng_checkpoint.RNG.decode({**streams.state_dict(), "offsets": {"init": -1}}, identity().manifest)
    assert len(streams.state_dict()["master_seed"]) == 16


def test_functional_fp_in_the_fingerprints_file_is_bound_by_the_header(tmp_path):
    """functional_fp lives in data/cursors=fingerprints.cbor, a container entry:
    the header's checkpoint_merkle_root fixes its bytes, so a well-formed file
    with another functional_fp is refused by verify (and restore) exactly as a
    changed header field would be (docs/rng.md)."""
    store_dir = str(tmp_path / "store")
    ident = identity()
    streams = RngStreams.from_manifest(ident.manifest)
    fp = uc.functional_fp(0.5, 0.25, "binary", ident.manifest.spec_version)
    with CheckpointStore.open(store_dir, ident, KEY) as store:
        store.start_run(DATASET, world_size=1)
        store.commit(CheckpointState(0, {DATASET: uc.Cursor()}, extra_cursors={
            "fingerprints": rng_checkpoint.fingerprints(streams, functional_fp=fp)}))
    assert restore_latest(store_dir, ident).extra_cursors["fingerprints"]["functional_fp"] == fp
    found = [os.path.join(d, f) for d, _,
             files in os.walk(store_dir) for f in files if f == "cursors=fingerprints.cbor"]
    assert len(found) == 1
    with open(found[0], "rb") as handle:
        data = handle.read()
    assert data.count(fp) == 1
    with open(found[0], "wb") as handle:  # same size, well formed, another functional_fp
        handle.write(data.replace(fp, bytes(b ^ 1 for b in fp)))
    with pytest.raises(uc.UmlosError) as info:
        verify_store(store_dir)
    assert info.value.code == errors.CHECKPOINT_HASH_MISMATCH and "fingerprints" in info.value.message
    with pytest.raises(uc.UmlosError):
        restore_latest(store_dir, ident)
