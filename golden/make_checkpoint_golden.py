"""Generate golden/checkpoint_store_v1/, the golden checkpoint store (docs/checkpoint-format.md §15).

Run from the repository root::

    python golden/make_checkpoint_golden.py             # writes golden/checkpoint_store_v1/
    python golden/make_checkpoint_golden.py --out DIR   # somewhere else

Tests only ever compare against the checked-in bytes; regenerate only for a
deliberate format change (a new schema version, say), and say so in the
commit. Bump GENERATOR_VERSION whenever the state below changes.

What it holds: one store written by a fixed run. Tenant ``golden-tenant``,
run ``golden-run``, an inline manifest (N = 1000, G = 8, blocks of 64), a
signing key derived from a published label (Ed25519 is deterministic, so the
certificates are reproducible), two ranks, and two commits at steps 2 and 4,
each with a checkpoint of :func:`golden_state`: tensor shards in six dtypes,
optimizer state, a DP accountant, a TMMU plan, a byte blob and an array.
The tape holds the run_header, one iter per NextBatch call, and the
checkpoint records. ``checkpoint_store_v1.json`` lists every file's SHA-256
and the checkpoint hashes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile

GENERATOR_VERSION = "1"
NAME = "checkpoint_store_v1"
TENANT = "golden-tenant"
RUN = "golden-run"
KEY_SEED = hashlib.sha256(b"umlos-cuda golden checkpoint key: public, never use for real checkpoints").digest()
MANIFEST = {
    "spec_version": "UML_OS-v3.8-OS",
    "seed": 20260218,
    "global_batch_size": 8,
    "data": {"sampler_block_size": 64, "drop_last": False},
    "datasets": {"train": {"id": "golden-corpus", "version": "1", "hash": "sha256:" + "ab" * 32, "cardinality": 1000}},
    "policy": {"name": "golden"},
}
WORLD_SIZE = 2
COMMIT_STEPS = (2, 4)


def golden_state(t: int, cursor):
    """The state checkpointed at step ``t`` (every array depends on ``t``)."""
    import numpy as np

    from umlos_cuda.checkpoint import CheckpointState

    return CheckpointState(
        t,
        {"train": cursor},
        tensors={
            rank: [
                {"w_f32": (np.arange(12, dtype=np.float32).reshape(3, 4) * 0.5 + t + rank),
                 "w_f16": np.linspace(-1, 1, 5, dtype=np.float16) * t,
                 "b_i64": np.array([t, -t, rank], dtype=np.int64)},
                {"mask": np.array([True, False, t % 2 == 0]), "bytes_u8": np.arange(7, dtype=np.uint8) + t,
                 "w_f64": np.array([[1.0 / 3.0, t], [rank, -0.0]])},
            ]
            for rank in range(WORLD_SIZE)
        },
        optimizer={rank: {"exp_avg": np.full(4, 0.125 * t, dtype=np.float32), "step": np.array([t], dtype=np.int64)}
                   for rank in range(WORLD_SIZE)},
        dp_accountant={"epsilon": 0.5 * t, "delta": 1e-6, "orders": [2, 4, 8]},
        tmmu_plan={"arena_bytes": 1 << 20, "blocks": [[0, 4096], [4096, 8192]]},
        user_state={"rng": bytes(range(t, t + 16)), "loss": np.array([1.0, 0.5, 0.25][:t % 3 + 1])},
    )


def build(store_dir: str) -> dict:
    """Write the golden store into ``store_dir`` (which must not exist); return a summary."""
    import umlos_cuda as uc
    from umlos_cuda.checkpoint import CheckpointStore, RunIdentity, signing
    from umlos_cuda.checkpoint.tape import iter_fields

    manifest = uc.Manifest.from_dict(MANIFEST)
    identity = RunIdentity(TENANT, RUN, manifest)
    cursor = uc.Cursor()
    hashes = []
    with CheckpointStore.open(store_dir, identity, KEY_SEED) as store:
        store.start_run("train", world_size=WORLD_SIZE)
        t = 0
        for target in COMMIT_STEPS:
            while t < target:
                t += 1
                for rank in range(WORLD_SIZE):
                    batch = uc.next_batch(manifest, "train", WORLD_SIZE, rank, cursor=cursor, backend="numpy", t=t)
                    store.tape.append(iter_fields(batch, t))
                cursor = batch.cursor
            hashes.append(store.commit(golden_state(t, cursor)).checkpoint_hash.hex())
    os.unlink(os.path.join(store_dir, ".lock"))
    files = {}
    for folder, _, names in os.walk(store_dir):
        for name in names:
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, store_dir).replace(os.sep, "/")
            with open(path, "rb") as handle:
                files[rel] = hashlib.sha256(handle.read()).hexdigest()
    return {
        "generator": {"script": "golden/make_checkpoint_golden.py", "version": GENERATOR_VERSION},
        "tenant_id": TENANT,
        "run_id": RUN,
        "public_key": signing.public_key_bytes(KEY_SEED).hex(),
        "checkpoint_hashes": hashes,
        "final_cursor": cursor.to_dict(),
        "files": dict(sorted(files.items())),
    }


def main(argv=None) -> int:
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=here, help="folder to write checkpoint_store_v1/ and its .json into")
    args = parser.parse_args(argv)
    sys.path.insert(0, os.path.dirname(here))
    target = os.path.join(args.out, NAME)
    with tempfile.TemporaryDirectory() as scratch:
        store = os.path.join(scratch, NAME)
        summary = build(store)
        if os.path.exists(target):
            shutil.rmtree(target)
        shutil.copytree(store, target)
    with open(os.path.join(args.out, NAME + ".json"), "w") as handle:
        json.dump(summary, handle, indent=1)
        handle.write("\n")
    print(f"wrote {target} ({len(summary['files'])} files), checkpoints {', '.join(summary['checkpoint_hashes'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
