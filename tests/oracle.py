"""An independent oracle for NextBatch_v2, written from the rules R1-R9 (docs/spec/).

Nothing here imports umlos_cuda or NumPy: every value is a Python int, every
index is computed one position at a time, and each function is a direct
transcription of one rule of the specification in ``docs/spec/`` (cited in
its docstring by its label R1..R9). The tests compare the engine against this file; agreement of
two implementations written separately from the same text is the evidence that
both follow the text.

Cost: an epoch's setup is O(num_full_blocks) Philox draws (the Fisher-Yates of
R5, about 10 us each in pure Python); after that any single position costs
O(1) plus one coprime scan per block touched (cached). So a position at
N = 10^11 with blocks of 2^20 (95,367 full blocks) costs about a second of
setup and microseconds after.

The ``streaming_infinite`` preset is not in R1-R9; its oracle follows the
description in the project's presets documentation: the stream is epoch e's
train sequence followed by epoch e+1's and so on, with its own sampling_mode
string, drop_last hashed as false, and the cursor carried into later epochs.
"""

from __future__ import annotations

import copy
import hashlib
from dataclasses import dataclass
from functools import lru_cache
from math import gcd

import cbor2

MASK32 = 0xFFFFFFFF
MASK64 = (1 << 64) - 1

# ---------------------------------------------------------------- R1 Philox
M0 = 0xD2511F53
M1 = 0xCD9E8D57
W0 = 0x9E3779B9
W1 = 0xBB67AE85


def philox4x32_10(counter, key):
    """R1: ten rounds; the key is bumped between rounds."""
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for round_number in range(10):
        if round_number > 0:
            k0 = (k0 + W0) & MASK32
            k1 = (k1 + W1) & MASK32
        product0 = M0 * c0
        product1 = M1 * c2
        hi0, lo0 = product0 >> 32, product0 & MASK32
        hi1, lo1 = product1 >> 32, product1 & MASK32
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return c0, c1, c2, c3


# R1 known-answer table, as printed there: (counter, key, output).
PHILOX_KATS = [
    ((0x00000000, 0x00000000, 0x00000000, 0x00000000), (0x00000000, 0x00000000),
     (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF),
     (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


# ---------------------------------------------------------------- R2 hashing
def cbor_canonical(value) -> bytes:
    """R2: ``cbor2.dumps(x, canonical=True)``."""
    return cbor2.dumps(value, canonical=True)


def sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def hash_canonical(value) -> bytes:
    return sha256(cbor_canonical(value))


# ---------------------------------------------------------------- R3 manifest
SPEC_VERSION_DEFAULT = "UML_OS-v3.8-OS"
SEED_DEFAULT = 0
BLOCK_SIZE_DEFAULT = 1048576
DROP_LAST_DEFAULT = False


def canonical_manifest(raw: dict) -> dict:
    """R3: fill the four defaults (a copy; ``raw`` is not changed)."""
    manifest = copy.deepcopy(dict(raw))
    if "spec_version" not in manifest:
        manifest["spec_version"] = SPEC_VERSION_DEFAULT
    if "seed" not in manifest:
        manifest["seed"] = SEED_DEFAULT
    if manifest.get("data") is None:
        manifest["data"] = {}
    data = manifest["data"]
    if "sampler_block_size" not in data:
        data["sampler_block_size"] = BLOCK_SIZE_DEFAULT
    if "drop_last" not in data:
        data["drop_last"] = DROP_LAST_DEFAULT
    return manifest


def manifest_hash(raw: dict) -> bytes:
    """R3: ``SHA-256(CBOR_CANONICAL(canonical_manifest))``."""
    return hash_canonical(canonical_manifest(raw))


def replay_token(raw: dict) -> bytes:
    """R3: ``SHA-256(utf8(spec_version) || policy_hash || env_manifest_hash || uint64_be(seed))``."""
    manifest = canonical_manifest(raw)
    policy_hash = hash_canonical(manifest.get("policy") or {})
    env_manifest_hash = hash_canonical(manifest.get("env") or {})
    seed = manifest["seed"]
    return sha256(manifest["spec_version"].encode("utf-8") + policy_hash + env_manifest_hash + seed.to_bytes(8, "big"))


# ---------------------------------------------------------------- R4 epoch seed
def epoch_seed(token: bytes, m_hash: bytes, dataset_key: str, epoch: int) -> bytes:
    """R4: the first 16 bytes of the hash of the five-element array."""
    return hash_canonical(["nextbatch_epoch_seed_v2", token, m_hash, dataset_key, epoch])[0:16]


def seed_words(seed16: bytes):
    """R4: ``w_i = u32le(epoch_seed[4i : 4i+4])``."""
    return tuple(int.from_bytes(seed16[4 * i : 4 * i + 4], "little") for i in range(4))


def draw(seed16: bytes, n: int, domain: int):
    """R4: draw ``n`` of ``domain``: counter ``(lo32(n), hi32(n), w2, w3 XOR d)``, key ``(w0, w1)``."""
    w0, w1, w2, w3 = seed_words(seed16)
    x0, x1, x2, x3 = philox4x32_10((n & MASK32, n >> 32, w2, w3 ^ domain), (w0, w1))
    return x0 | (x1 << 32), x2 | (x3 << 32)


DOMAIN_PERMUTE = 1
DOMAIN_INTRA = 2


# ---------------------------------------------------------------- R5 block permute
def seeded_block_permute(seed16: bytes, num_full_blocks: int) -> list[int]:
    """R5: Fisher-Yates, ``i = B-1 .. 1``, ``j = (r0 * (i+1)) >> 64``."""
    order = list(range(num_full_blocks))
    for i in range(num_full_blocks - 1, 0, -1):
        r0, _ = draw(seed16, i, DOMAIN_PERMUTE)
        j = (r0 * (i + 1)) >> 64
        order[i], order[j] = order[j], order[i]
    return order


# ---------------------------------------------------------------- R6 intra-block map
def affine_parameters(seed16: bytes, pb: int, block_size: int, n: int):
    """R6: ``(block_start, m, a, c)`` of permuted block ``pb``."""
    block_start = pb * block_size
    m = min(block_size, n - block_start)
    if m == 1:
        return block_start, 1, None, None
    k0, k1 = draw(seed16, pb, DOMAIN_INTRA)
    a = 1 + (k0 % (m - 1))
    chosen = None
    for i in range(m - 1):
        cand = 1 + ((a - 1 + i) % (m - 1))
        if gcd(cand, m) == 1:
            chosen = cand
            break
    if chosen is None:  # unreachable for m > 1 (cand = 1 always qualifies)
        raise AssertionError("CONTRACT_VIOLATION")
    return block_start, m, chosen, k1 % m


def intra_block_map(seed16: bytes, pb: int, local_pos: int, block_size: int, n: int) -> int:
    block_start, m, a, c = affine_parameters(seed16, pb, block_size, n)
    if m == 1:
        return block_start
    return block_start + (a * local_pos + c) % m


class EpochOracle:
    """One epoch's train-mode virtual sequence: ``index(p)`` for ``0 <= p < N``."""

    def __init__(self, seed16: bytes, n: int, block_size: int) -> None:
        self.seed16 = seed16
        self.n = n
        self.block_size = block_size
        self.num_full_blocks = n // block_size
        self.order = seeded_block_permute(seed16, self.num_full_blocks)
        self._params: dict[int, tuple] = {}

    def permuted_block(self, virtual_block: int) -> int:
        if virtual_block == self.num_full_blocks:  # the short tail block stays last (R5)
            return self.num_full_blocks
        return self.order[virtual_block]

    def index(self, p: int) -> int:
        if not 0 <= p < self.n:
            raise ValueError(f"position {p} outside [0, {self.n})")
        pb = self.permuted_block(p // self.block_size)
        params = self._params.get(pb)
        if params is None:
            params = self._params[pb] = affine_parameters(self.seed16, pb, self.block_size, self.n)
        block_start, m, a, c = params
        if m == 1:
            return block_start
        return block_start + (a * (p % self.block_size) + c) % m

    def window(self, start: int, count: int) -> list[int]:
        return [self.index(p) for p in range(start, start + count)]


@lru_cache(maxsize=16)
def _epoch_oracle(seed16: bytes, n: int, block_size: int) -> EpochOracle:
    return EpochOracle(seed16, n, block_size)


# ---------------------------------------------------------------- R7-R9 NextBatch
MODE_SHUFFLE = "SHUFFLE_WITHOUT_REPLACEMENT_BLOCK_AFFINE_V1"
MODE_SEQUENTIAL = "SEQUENTIAL_V1"
MODE_STREAMING = "STREAMING_SHUFFLE_BLOCK_AFFINE_V1"


def sampler_config_hash(sampling_mode: str, block_size: int, drop_last: bool) -> bytes:
    """R9."""
    return hash_canonical(
        [sampling_mode, block_size, drop_last, "epoch_seed_rule_v2", "intra_block_affine_coprime_v1",
         "rank_contiguous_shard_v1"]
    )


def data_replay_t(token: bytes, dataset_key: str, epoch: int, position: int, world_size: int, rank: int) -> bytes:
    """R9: from the cursor before the call."""
    return hash_canonical(["nextbatch_v2", token, dataset_key, epoch, position, world_size, rank])


class OracleError(Exception):
    """The set of R8 codes whose condition holds (an implementation raises one of them)."""

    def __init__(self, codes: set[str]) -> None:
        super().__init__(", ".join(sorted(codes)))
        self.codes = codes


@dataclass
class OracleBatch:
    indices: list[int]
    cursor: tuple[int, int]
    sampling_mode: str
    sampler_config_hash: str
    data_replay_t: str


class Oracle:
    """NextBatch_v2 over one manifest (a plain dict, as loaded from YAML/JSON)."""

    def __init__(self, raw_manifest: dict, token: bytes | None = None) -> None:
        self.raw = raw_manifest
        self.manifest = canonical_manifest(raw_manifest)
        self.hash = manifest_hash(raw_manifest)
        self.token = replay_token(raw_manifest) if token is None else token
        self.block_size = self.manifest["data"]["sampler_block_size"]
        self.drop_last = self.manifest["data"]["drop_last"]
        self.global_batch_size = self.manifest["global_batch_size"]

    def cardinality(self, dataset_key: str) -> int:
        return self.manifest["datasets"][dataset_key]["cardinality"]

    def epoch(self, dataset_key: str, epoch: int) -> EpochOracle:
        seed16 = epoch_seed(self.token, self.hash, dataset_key, epoch)
        return _epoch_oracle(seed16, self.cardinality(dataset_key), self.block_size)

    def epoch_limit(self, dataset_key: str, stage: str, streaming: bool = False) -> int:
        """R7."""
        n = self.cardinality(dataset_key)
        if stage == "train" and self.drop_last and not streaming:
            return (n // self.global_batch_size) * self.global_batch_size
        return n

    def index(self, dataset_key: str, stage: str, epoch: int, p: int) -> int:
        """R7: train maps ``p`` through R5/R6; eval and infer return ``p``."""
        if stage == "train":
            return self.epoch(dataset_key, epoch).index(p)
        return p

    def violations(self, dataset_key, world_size, rank, stage, epoch, global_index, streaming=False) -> set[str]:
        """R8: every code whose condition holds for these inputs."""
        codes = set()
        if dataset_key not in self.manifest["datasets"]:
            return {"INVALID_DATASET_KEY"}
        if stage not in ("train", "eval", "infer"):
            return {"INVALID_STAGE_TYPE"}
        n = self.cardinality(dataset_key)
        g = self.global_batch_size
        drop_last = self.drop_last and not streaming
        if n == 0:
            codes.add("CARDINALITY_MISMATCH")
        if g == 0 or (world_size > 0 and g % world_size != 0) or self.block_size == 0:
            codes.add("BATCH_SIZE_INCONSISTENT")
        if stage == "train" and drop_last and g > n:
            codes.add("BATCH_SIZE_INCONSISTENT")
        if world_size == 0 or rank >= world_size:
            codes.add("INVALID_RANK")
        if n > 0 and g > 0 and global_index >= self.epoch_limit(dataset_key, stage, streaming):
            codes.add("GLOBAL_POSITION_EXCEEDS_CARDINALITY")
        return codes

    def next_batch(self, dataset_key, world_size, rank, stage, epoch, global_index, streaming=False) -> OracleBatch:
        """R7 positions and cursor advance, R9 metadata; R8 failures raise :class:`OracleError`."""
        codes = self.violations(dataset_key, world_size, rank, stage, epoch, global_index, streaming)
        if codes:
            raise OracleError(codes)
        n = self.cardinality(dataset_key)
        g = self.global_batch_size
        mb = g // world_size
        first = global_index + rank * mb
        if streaming:
            indices = []
            for p in range(first, first + mb):
                if p % n == 0 or p == first:
                    sequence = self.epoch(dataset_key, epoch + p // n)
                indices.append(sequence.index(p % n))
            epochs, index = divmod(global_index + g, n)
            cursor = (epoch + epochs, index)
            mode = MODE_STREAMING
            drop_last = False
        else:
            limit = self.epoch_limit(dataset_key, stage)
            lo, hi = min(first, limit), min(first + mb, limit)
            if stage == "train" and hi > lo:
                sequence = self.epoch(dataset_key, epoch)
                indices = [sequence.index(p) for p in range(lo, hi)]
            else:
                indices = list(range(lo, hi))
            produced = min(g, limit - global_index)
            index = global_index + produced
            cursor = (epoch + 1, 0) if index >= limit else (epoch, index)
            mode = MODE_SHUFFLE if stage == "train" else MODE_SEQUENTIAL
            drop_last = self.drop_last
        if cursor[0] > MASK64:
            raise OracleError({"UINT64_OVERFLOW"})
        return OracleBatch(
            indices=indices,
            cursor=cursor,
            sampling_mode=mode,
            sampler_config_hash=sampler_config_hash(mode, self.block_size, drop_last).hex(),
            data_replay_t=data_replay_t(self.token, dataset_key, epoch, global_index, world_size, rank).hex(),
        )


def indices_le_bytes(indices) -> bytes:
    """The golden files' encoding: uint64 little-endian, concatenated."""
    return b"".join(int(i).to_bytes(8, "little") for i in indices)
