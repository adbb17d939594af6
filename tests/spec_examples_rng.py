"""The worked examples of docs/spec/rng.md and docs/spec/nextbatch-v1.md.

Each function computes one example block's ``(label, value)`` rows from
umlos_cuda, cross-checked against the independent oracle (``oracle.py``)
where it computes the same thing. tests/test_spec_examples.py merges
:data:`RNG_EXAMPLES` into its registry and compares every block with the
documents; ``python tests/test_spec_examples.py NAME`` prints a block.
"""

from __future__ import annotations

import json
import struct

import numpy as np

import oracle
import umlos_cuda as uc
from umlos_cuda.hashing import cbor_canonical, sha256
from umlos_cuda.rng.nextbatch_v1 import derived_manifest, next_batch_v1
from umlos_cuda.rng.probes import functional_fp, functional_fp_preimage, probe_indices
from umlos_cuda.rng.streams import MASTER_DERIVATION, STREAMS, RngStreams, draws_at, master_words
from umlos_cuda.rng.state_fingerprint import StateFingerprint, encode, order_hash

RNG_EXAMPLES = {}


def example(name):
    def register(function):
        RNG_EXAMPLES[name] = function
        return function

    return register


def spec():
    """tests/test_spec_examples.py, for its toy manifest and value formats. Imported
    when an example runs, not when this module loads: that module imports this one."""
    import test_spec_examples

    return test_spec_examples


def words(*values: int) -> str:
    return spec().words(*(int(v) for v in values))


def spaced_hex(data: bytes) -> str:
    return spec().spaced_hex(data)


def ints(values) -> str:
    return spec().ints(values)


TOY_KEY = "toy"


def toy_raw() -> dict:
    """The toy manifest of docs/spec/philox-and-hashing.md §3.4."""
    return spec().TOY_RAW


def toy_streams(drawn: bool = False) -> RngStreams:
    """The toy manifest's master stream; ``drawn``: after 2 init, 31 cluster and 1 misc draws."""
    streams = RngStreams.from_manifest(toy_raw())
    if drawn:
        for stream, count in (("init", 2), ("cluster", 31), ("misc", 1)):
            streams.draw(stream, count)
    return streams


def counter(block: int, stream_number: int, seed16: bytes) -> tuple[int, int, int, int]:
    _, _, w2, w3 = master_words(seed16)
    return block & 0xFFFFFFFF, block >> 32, w2 ^ stream_number, w3


# ------------------------------------------------------------------ rng.md
@example("rng-master")
def rng_master():
    m = uc.Manifest.from_dict(toy_raw())
    preimage = cbor_canonical([MASTER_DERIVATION, m.replay_token, m.hash])
    seed16 = toy_streams().master_seed
    assert sha256(preimage)[:16] == seed16 == oracle.hash_canonical([MASTER_DERIVATION, oracle.replay_token(toy_raw()),
                                                                      oracle.manifest_hash(toy_raw())])[:16]
    return [
        ("preimage", spaced_hex(preimage)),
        ("SHA-256(preimage)", sha256(preimage).hex()),
        ("master_seed", seed16.hex()),
        ("w0 w1 w2 w3", words(*master_words(seed16))),
    ]


@example("rng-substreams")
def rng_substreams():
    seed16 = toy_streams().master_seed
    w0, w1, _, _ = master_words(seed16)
    rows = []
    for number, stream in enumerate(STREAMS):
        for block in (0, 1):
            c = counter(block, number, seed16)
            output = oracle.philox4x32_10(c, (w0, w1))
            rows.append((f"{stream}: block {block} counter", words(*c)))
            rows.append((f"{stream}: block {block} output", words(*output)))
        draws = draws_at(seed16, stream, 0, 8)
        assert draws.tolist() == [oracle.philox4x32_10(counter(n // 4, number, seed16), (w0, w1))[n % 4]
                                  for n in range(8)]
        rows.append((f"{stream}: draws 0..7", ints(draws)))
    offset = (1 << 34) - 2
    for block in ((1 << 32) - 1, 1 << 32):
        rows.append((f"misc: block {block} counter", words(*counter(block, 2, seed16))))
    rows.append((f"misc: draws {offset}..{offset + 3}", ints(draws_at(seed16, "misc", offset, 4))))
    return rows


@example("rng-state")
def rng_state():
    streams = toy_streams(drawn=True)
    state = streams.state_dict()
    state_bytes = streams.state_bytes()
    restored = toy_streams()
    restored.load_state_dict(state)
    next_draws = [streams.draw(name, 2) for name in STREAMS]
    assert [restored.draw(name, 2).tolist() for name in STREAMS] == [d.tolist() for d in next_draws]
    return [
        ("offsets after the draws", json.dumps(state["offsets"])),
        ("CBOR_CANONICAL(state_dict())", spaced_hex(cbor_canonical(state))),
        ("state_bytes", spaced_hex(state_bytes)),
        ("rng_fingerprint_t", sha256(state_bytes).hex()),
        ("next draws of init, cluster, misc", ", ".join(ints(d) for d in next_draws)),
    ]


@example("state-fp")
def state_fp():
    streams = toy_streams(drawn=True)
    order = order_hash(toy_raw(), TOY_KEY, 0)
    config = oracle.sampler_config_hash("SHUFFLE_WITHOUT_REPLACEMENT_BLOCK_AFFINE_V1", 8, False)
    m = uc.Manifest.from_dict(toy_raw())
    seed16 = oracle.epoch_seed(m.replay_token, m.hash, TOY_KEY, 0)
    assert order == oracle.hash_canonical(["umlos_epoch_order_v1", config, 30, seed16])
    data_plane = StateFingerprint().add_data_cursor(0, 12, order).add_rng(streams)
    theta = {"w": np.array([0.5, -1.0], dtype=np.float32)}
    full = StateFingerprint().add("theta", theta).add_data_cursor(0, 12, order).add("state", 0).add_rng(streams)
    return [
        ("order hash, toy, epoch 0", order.hex()),
        ("preimage, items 4 and 6", spaced_hex(data_plane.preimage())),
        ("state_fp, items 4 and 6", data_plane.hexdigest()),
        ("encode({w: float32 [0.5, -1.0]})", spaced_hex(encode(theta))),
        ("state_fp, items 1, 4, 5 (0) and 6", full.hexdigest()),
    ]


@example("functional-fp")
def functional_example():
    loss, metric = 0.6931471805599453, 0.5
    preimage = functional_fp_preimage(loss, metric, "multiclass", "UML_OS-v3.8-OS")
    assert preimage == struct.pack(">dd", loss, metric) + b"multiclassUML_OS-v3.8-OS"
    probes = probe_indices(toy_raw())
    return [
        ("probe set, toy (N = 30), first 40", ints(probes[:40])),
        ("probe set, last 4", ints(probes[-4:])),
        ("preimage (0.6931471805599453, 0.5, multiclass)", spaced_hex(preimage)),
        ("functional_fp", functional_fp(loss, metric, "multiclass", "UML_OS-v3.8-OS").hex()),
    ]


# ------------------------------------------------------------------ nextbatch-v1.md
@example("v1-derived")
def v1_derived():
    derived = derived_manifest(toy_raw(), TOY_KEY)
    canonical = json.dumps(derived.to_dict(), sort_keys=True)
    m = uc.Manifest.from_dict(toy_raw())
    seed16 = oracle.epoch_seed(derived.replay_token, derived.hash, TOY_KEY, 0)
    assert oracle.manifest_hash(derived.to_dict()) == derived.hash
    return [
        ("manifest_hash of the toy manifest", m.hash.hex()),
        ("derived manifest", canonical),
        ("derived manifest_hash", derived.hash.hex()),
        ("derived kernel_replay_token", derived.replay_token.hex()),
        ("epoch_seed of epoch 0", seed16.hex()),
    ]


@example("v1-toy")
def v1_toy():
    derived = derived_manifest(toy_raw(), TOY_KEY)
    rows = []
    for epoch in (0, 1):
        whole = next_batch_v1(toy_raw(), TOY_KEY, 1, 0, epoch, backend="numpy").indices
        epoch_oracle = oracle.Oracle(derived.to_dict()).epoch(TOY_KEY, epoch)
        assert whole.tolist() == [epoch_oracle.index(p) for p in range(30)]
        rows.append((f"epoch {epoch}, permutation", ints(whole)))
    for world_size in (3, 4):
        for rank in range(world_size):
            shard = next_batch_v1(toy_raw(), TOY_KEY, world_size, rank, 0, backend="numpy").indices
            rows.append((f"epoch 0, W = {world_size}, rank {rank}", ints(shard)))
    streams = toy_streams()
    batch = next_batch_v1(toy_raw(), TOY_KEY, 3, 0, 0, streams=streams, backend="numpy")
    rows.append(("misc draw of the first call", str(batch.misc_draw)))
    rows.append(("misc offset after it", str(streams.offset("misc"))))
    rows.append(("order hash of epoch 0", batch.order_hash.hex()))
    return rows
