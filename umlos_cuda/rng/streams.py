"""The kernel's RNG: one Philox4x32-10 master stream with three sub-streams.

A trainer built on the UML_OS contract draws every random number from one
master stream keyed from the manifest, split into fixed sub-streams
``init``, ``cluster`` and ``misc``. Each sub-stream is read strictly in
order: its 64-bit offset counts the uint32 draws taken so far, a draw of
``k`` returns the next ``k`` words and advances the offset by ``k``, and
nothing can skip ahead or reseed. So the whole random state of a run is the
16-byte master seed and three offsets (:meth:`RngStreams.state_dict`), which
a checkpoint saves and a restore puts back, giving the same draws after.

The bytes are specified in docs/spec/rng.md:

- ``master_seed = SHA-256(CBOR_CANONICAL(["uml_os_rng_master_v1",
  kernel_replay_token, manifest_hash]))[0:16]``, read as four little-endian
  words ``w0..w3``; the Philox key is ``(w0, w1)``. The derivation's tag is
  its own, so the key never coincides with a NextBatch epoch seed (whose
  draws use domains 1 and up of another derivation).
- Sub-stream ``s`` (``init`` 0, ``cluster`` 1, ``misc`` 2) occupies the
  counters ``s * 2^64 + b`` of the master stream's 128-bit counter space:
  block ``b`` of it is Philox of the counter ``(lo32(b), hi32(b), w2 XOR s,
  w3)``, and its four output words are draws ``4b .. 4b + 3``.

Draws are computed by ``kernels/philox.cuh`` compiled into the native
extension when it is built, or by its NumPy twin (:mod:`umlos_cuda.philox`),
bit for bit the same. Operators declare what they draw with
:func:`consumes` (:mod:`umlos_cuda.rng.contract`), which checks it.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Mapping
from typing import Any

import numpy as np

from .. import checks, errors
from ..errors import UINT64_MAX, UmlosError
from ..hashing import hash_canonical, sha256
from ..manifest.core import Manifest, as_manifest
from ..philox import philox4x32_10
from .contract import NONE, Accountant, Declaration, consumes

__all__ = [
    "BACKENDS",
    "MASTER_DERIVATION",
    "NONE",
    "STATE_FORMAT",
    "STREAMS",
    "Declaration",
    "RngStreams",
    "check_state",
    "consumes",
    "master_seed",
    "substream_blocks",
]

#: The sub-streams, in the order of their numbers (docs/spec/rng.md §2).
STREAMS = ("init", "cluster", "misc")
STREAM_NUMBERS = {name: number for number, name in enumerate(STREAMS)}
#: The tag of the master seed's derivation (docs/spec/rng.md §1).
MASTER_DERIVATION = "uml_os_rng_master_v1"
#: ``state_dict()["format"]``: names the derivation and the layout together.
STATE_FORMAT = "umlos-cuda/rng-state-v1"
#: The operator named in this module's failure records.
RNG_OPERATOR = "UML_OS.Random.Streams_v1"



def master_seed(manifest_hash: bytes, replay_token: bytes) -> bytes:
    """The 16-byte master seed of a run (docs/spec/rng.md §1)."""
    return hash_canonical([MASTER_DERIVATION, replay_token, manifest_hash])[:16]


def master_words(seed16: bytes) -> tuple[int, int, int, int]:
    """``(w0, w1, w2, w3)``: the master seed as four little-endian uint32 words."""
    return struct.unpack("<4I", seed16)


def substream_blocks(seed16: bytes, stream_number: int, first_block: int, count: int,
                     backend: str = "numpy") -> np.ndarray:
    """Philox output of blocks ``first_block .. first_block + count - 1`` of one
    sub-stream, as a ``(count, 4)`` uint32 array (row ``i`` is block
    ``first_block + i``'s words ``x0..x3``), computed by the NumPy twin of
    ``kernels/philox.cuh`` or (``backend="native"``) by the header itself."""
    w0, w1, w2, w3 = master_words(seed16)
    if backend == "native":
        out = np.empty(4 * count, dtype=np.uint32)
        _native_module().philox_stream(w0, w1, w2 ^ stream_number, w3, first_block, out)
        return out.reshape(count, 4)
    blocks = np.arange(count, dtype=np.uint64) + np.uint64(first_block)
    x = philox4x32_10(blocks & np.uint64(0xFFFFFFFF), blocks >> np.uint64(32),
                      np.uint64(w2 ^ stream_number), np.uint64(w3), w0, w1)
    return np.stack(x, axis=-1).astype(np.uint32)


def draws_at(seed16: bytes, stream: str, offset: int, count: int, backend: str = "numpy") -> np.ndarray:
    """Draws ``offset .. offset + count - 1`` of sub-stream ``stream`` (uint32).

    A pure function of its arguments; :meth:`RngStreams.draw` is the only
    caller that moves an offset."""
    if count == 0:
        return np.empty(0, dtype=np.uint32)
    first_block, skip = divmod(offset, 4)
    last_block = (offset + count - 1) // 4
    words = substream_blocks(seed16, STREAM_NUMBERS[stream], first_block, last_block - first_block + 1,
                             resolve_backend(backend))
    return words.reshape(-1)[skip : skip + count].copy()


#: The backends that compute draws: the same bits on each (tests/test_rng.py).
BACKENDS = ("numpy", "native", "auto")


def resolve_backend(backend: str) -> str:
    """``numpy`` or ``native`` for ``backend`` (``auto``: native when built, else numpy)."""
    if backend == "numpy":
        return backend
    if backend in ("native", "auto"):
        if _native_module() is not None:
            return "native"
        if backend == "auto":
            return "numpy"
        raise UmlosError(errors.BACKEND_UNAVAILABLE,
                         "the C++ extension umlos_cuda._native is not built (or predates philox_stream); "
                         "use backend 'numpy' (same draws) or reinstall umlos-cuda with a C++ compiler",
                         operator=RNG_OPERATOR)
    raise UmlosError(errors.BACKEND_UNAVAILABLE, f"RNG backend {backend!r} is not one of {', '.join(BACKENDS)}",
                     operator=RNG_OPERATOR)


def _native_module():
    try:
        from .. import _native  # type: ignore[attr-defined]  # C++, built at install: mypy reads no .so
    except ImportError:
        return None
    return _native if hasattr(_native, "philox_stream") else None


class RngStreams:
    """The master stream of one run and the offsets of its sub-streams.

    Build it with :meth:`from_manifest`; draw with :meth:`draw`; save and
    restore with :meth:`state_dict` and :meth:`load_state_dict`. Every
    instance has an :attr:`accountant` (:class:`~.contract.Accountant`)
    that checks the operators declared with :func:`consumes` and keeps the
    table of their declarations.

    One instance serves one kernel thread: draws are serialised by a lock,
    but the accountant's record of open operators is the instance's, not
    the thread's.
    """

    STREAMS = STREAMS

    def __init__(self, seed16: bytes, replay_token: bytes, backend: str = "auto") -> None:
        checks.instance(seed16, "a master seed", bytes, length=16, fail=_state_invalid, message="{name} is 16 bytes")
        self._seed = seed16
        self.backend = resolve_backend(backend)
        self.replay_token = replay_token
        self._offsets = {name: 0 for name in STREAMS}
        self._lock = threading.Lock()
        self.accountant = Accountant(self)

    @classmethod
    def from_manifest(cls, manifest: Manifest | Mapping[str, Any] | str, replay_token: bytes | None = None,
                      backend: str = "auto") -> RngStreams:
        """The master stream of ``manifest``, every offset 0 (docs/spec/rng.md §1:
        Bootstrap seeds the master, draws nothing). ``replay_token`` (32
        bytes) replaces the manifest's ``kernel_replay_token`` as everywhere.
        ``backend`` computes the draws: ``numpy``, ``native`` (the C++
        extension) or ``auto`` (native when built); the draws are the same."""
        manifest = as_manifest(manifest)
        token = manifest.resolve_replay_token(replay_token)
        return cls(master_seed(manifest.hash, token), token, backend)

    # -- draws ------------------------------------------------------------------------
    def draw(self, stream: str, k: int) -> np.ndarray:
        """The next ``k`` uint32 draws of sub-stream ``stream``; its offset grows by ``k``."""
        stream = check_stream(stream)
        k = _check_count(k)
        with self._lock:
            offset = self._offsets[stream]
            if offset + k > UINT64_MAX:
                raise UmlosError(
                    errors.UINT64_OVERFLOW,
                    f"sub-stream {stream} is at offset {offset}; {k} more draws would pass 2^64 - 1",
                    operator=RNG_OPERATOR,
                )
            values = draws_at(self._seed, stream, offset, k, self.backend)
            self._offsets[stream] = offset + k
        return values

    def offset(self, stream: str) -> int:
        """Draws taken so far from ``stream``."""
        return self._offsets[check_stream(stream)]

    @property
    def offsets(self) -> dict[str, int]:
        """``{stream: offset}`` for the three sub-streams (a copy)."""
        with self._lock:
            return dict(self._offsets)

    @property
    def master_seed(self) -> bytes:
        return self._seed

    # -- state --------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """``{"format", "master_seed", "offsets": {init, cluster, misc}}``: plain
        data that canonical CBOR stores exactly (docs/spec/rng.md §3)."""
        return {"format": STATE_FORMAT, "master_seed": self._seed, "offsets": self.offsets}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Put back a state saved by :meth:`state_dict` of the same run.

        A state of another master (another manifest or replay token) would
        reseed the run, so it is refused (``RNG_STATE_INVALID``), as is any
        malformed state and a restore while a declared operator is running."""
        state = check_state(state)
        seed = state["master_seed"]
        if seed != self._seed:
            raise UmlosError(errors.RNG_STATE_INVALID,
                             f"the state's master seed {seed.hex()} is not this run's ({self._seed.hex()}): "
                             "it belongs to another manifest or replay token", operator=RNG_OPERATOR)
        if self.accountant.open_operators():
            raise UmlosError(errors.RNG_STATE_INVALID,
                             f"cannot restore while operator {self.accountant.open_operators()[-1]} is running",
                             operator=RNG_OPERATOR)
        with self._lock:
            self._offsets = dict(state["offsets"])

    def state_bytes(self) -> bytes:
        """``master_seed || uint64_be(init) || uint64_be(cluster) || uint64_be(misc)``
        (40 bytes): StateFingerprint_v1 item 6 (docs/spec/rng.md §5)."""
        offsets = self.offsets
        return self._seed + b"".join(struct.pack(">Q", offsets[name]) for name in STREAMS)

    def fingerprint(self) -> bytes:
        """``rng_fingerprint_t = SHA-256(state_bytes())`` (32 bytes)."""
        return sha256(self.state_bytes())

    def __repr__(self) -> str:
        return f"RngStreams(master_seed={self._seed.hex()!r}, offsets={self.offsets!r})"


def check_state(state: Any) -> dict[str, Any]:
    """``state`` as a plain RNG state if it has exactly the layout of
    :meth:`RngStreams.state_dict` (docs/spec/rng.md §3), else
    ``RNG_STATE_INVALID``. Whose master it is, is the caller's check."""
    state = checks.record(state, _STATE, fail=_state_invalid, not_a_map="an RNG state has exactly the keys {fields}; "
                          "got {type}", unknown=_STATE_KEYS_WRONG, missing=_STATE_KEYS_WRONG)
    return {"format": STATE_FORMAT, "master_seed": bytes(state["master_seed"]), "offsets": state["offsets"]}


def check_stream(stream: Any) -> str:
    """``stream`` if it names a sub-stream, else ``RNG_STREAM_INVALID`` naming the choices."""
    return checks.choice(stream, "sub-stream", STREAMS, fail=checks.raising(errors.RNG_STREAM_INVALID,
                                                                               operator=RNG_OPERATOR),
                         message="{name} {value!r} is not one of {choices}")


def _check_count(k: Any) -> int:
    return checks.uint64(k, "a draw count", fail=checks.raising(errors.RNG_STREAM_INVALID, operator=RNG_OPERATOR))


def _checked_offsets(offsets: Any, name: str, *, fail: checks.Fail) -> dict[str, int]:
    """The ``offsets`` field of a state: exactly the sub-streams, each a uint64."""
    offsets = checks.record(offsets, _OFFSETS, fail=fail, not_a_map="offsets has exactly the keys {fields}; got {type}",
                            unknown="offsets has exactly the keys {fields}; got {keys}",
                            missing="offsets has exactly the keys {fields}; got {keys}")
    return {stream: checks.uint64(offsets[stream], f"{name}.{stream}", fail=fail) for stream in STREAMS}


_state_invalid = checks.raising(errors.RNG_STATE_INVALID, operator=RNG_OPERATOR)
#: The layout of :meth:`RngStreams.state_dict`, in the order its fields are checked.
_STATE = {"format": checks.field(checks.equal, STATE_FORMAT, message="RNG state format {value!r} is not {expected!r}"),
          "master_seed": checks.field(checks.instance, bytes, length=16, message="{name} must be 16 bytes"),
          "offsets": checks.field(_checked_offsets)}
_STATE_KEYS_WRONG = "an RNG state has exactly the keys {fields}; got {keys}"
_OFFSETS = dict.fromkeys(STREAMS, checks.field(checks.anything))
