"""StateFingerprint_v1 (docs/spec/rng.md §5): one SHA-256 over a run's whole state.

It hashes eight items, hashed in this order: 1 ``theta``, 2
``optimizer``, 3 ``latent_buffer``, 4 ``data_cursor``, 5 ``state``, 6
``rng``, 7 ``protos``, 8 ``loss_hist``. The data plane owns items 4 (the
epoch, the index in it and the hash of the epoch's order) and 6 (the RNG
master seed and offsets); a trainer folds in the others with
:meth:`StateFingerprint.add`. Items may be added in any order and each at
most once; :meth:`StateFingerprint.digest` always hashes them in that
order, each framed as ``uint8(item number) || uint64_be(length) || bytes``
so that no two different sets of items share a preimage. An item left out
is absent from the preimage (a data loader's fingerprint holds items 4 and
6 only).

Values are encoded as docs/spec/rng.md §5.2 asks, big-endian binary64 or fixed-width
integers, whatever the array library or device they come from (NumPy,
PyTorch, CuPy), so the same state gives the same fingerprint in every
process and on every backend. The framing is specified byte by byte in
docs/spec/rng.md §5.1.

The order hash of item 4 stands for the "full current permutation hash"
(docs/spec/rng.md §5.3): the engine never materialises an epoch's order, so it hashes the
order's definition, which fixes every position (:func:`order_hash`).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping
from typing import Any

import numpy as np

from .. import checks, errors
from ..errors import UmlosError
from ..hashing import hash_canonical, sha256

#: The items, numbered from 1 in this order.
ITEMS = ("theta", "optimizer", "latent_buffer", "data_cursor", "state", "rng", "protos", "loss_hist")
ITEM_NUMBERS = {name: number for number, name in enumerate(ITEMS, 1)}
OPERATOR = "UML_OS.StateFingerprint_v1"
#: The tag of an order hash (docs/spec/rng.md §5.3).
ORDER_TAG = "umlos_epoch_order_v1"
#: Every NaN is hashed as this one quiet NaN, so payload bits cannot split a fingerprint.
CANONICAL_NAN = b"\x7f\xf8\x00\x00\x00\x00\x00\x00"


class StateFingerprint:
    """Collects the items of one StateFingerprint_v1 and hashes them.

    ``add(item, value)`` takes a value as bytes (the trainer's own
    serialisation, hashed as given), an integer (uint64), a float
    (binary64), an array or tensor, a mapping of names to arrays (sorted by
    name) or a list of such values; see :func:`encode`.
    """

    def __init__(self) -> None:
        self._items: dict[int, bytes] = {}

    def add(self, item: str, value: Any) -> StateFingerprint:
        """Fold ``value`` in as ``item`` (one of :data:`ITEMS`); returns self."""
        checks.choice(item, "item", ITEMS, fail=_invalid, message="{name} {value!r} is not one of {choices}")
        number = ITEM_NUMBERS[item]
        if number in self._items:
            raise _invalid(f"item {item} was already added; each item is hashed once")
        self._items[number] = encode(value, item)
        return self

    def add_data_cursor(self, epoch: int, index: int, order: bytes) -> StateFingerprint:
        """Item 4: ``uint64_be(epoch) || uint64_be(index) || order`` (order: 32 bytes, :func:`order_hash`)."""
        epoch, index = (checks.uint64(value, f"data_cursor {name}", fail=_invalid)
                        for name, value in (("epoch", epoch), ("index", index)))
        checks.instance(order, "data_cursor order hash", bytes, length=32, fail=_invalid,
                        message="{name} must be 32 bytes")
        return self.add("data_cursor", struct.pack(">QQ", int(epoch), int(index)) + order)

    def add_rng(self, streams: Any) -> StateFingerprint:
        """Item 6: the master seed and the three offsets (:meth:`RngStreams.state_bytes`)."""
        return self.add("rng", streams.state_bytes())

    def items(self) -> tuple[str, ...]:
        """The items added so far, in the order of :data:`ITEMS`."""
        return tuple(ITEMS[number - 1] for number in sorted(self._items))

    def preimage(self) -> bytes:
        """The bytes :meth:`digest` hashes."""
        return b"".join(
            struct.pack(">BQ", number, len(self._items[number])) + self._items[number] for number in sorted(self._items)
        )

    def digest(self) -> bytes:
        """``state_fp``: SHA-256 of :meth:`preimage` (32 bytes)."""
        return sha256(self.preimage())

    def hexdigest(self) -> str:
        return self.digest().hex()


def data_plane_fingerprint(streams: Any, epoch: int, index: int, order: bytes) -> bytes:
    """The data plane's StateFingerprint_v1: items 4 and 6 only."""
    return StateFingerprint().add_data_cursor(epoch, index, order).add_rng(streams).digest()


def order_hash(manifest: Any, dataset_key: str, epoch: int, *, stage: str = "train", preset: str | None = None,
               replay_token: bytes | None = None) -> bytes:
    """The hash of one epoch's NextBatch_v2 order (docs/spec/rng.md §5.3):
    ``SHA-256(CBOR_CANONICAL(["umlos_epoch_order_v1", sampler_config_hash, N,
    epoch_seed]))``, ``epoch_seed`` null for the sequential stages. The
    order is a function of exactly these, so equal hashes mean equal orders."""
    from ..epoch import epoch_seed
    from ..manifest.core import as_manifest
    from ..sampler import resolve_sampler

    manifest = as_manifest(manifest)
    spec = manifest.dataset(dataset_key)
    sampler = resolve_sampler(manifest, stage, preset)
    token = manifest.resolve_replay_token(replay_token)
    epoch = checks.uint64(epoch, "epoch", fail=_invalid)
    seed16 = epoch_seed(token, manifest.hash, dataset_key, epoch) if sampler.shuffled else None
    return hash_canonical([ORDER_TAG, sampler.config_hash, spec.cardinality, seed16])


# -- encoding -------------------------------------------------------------------------


def encode(value: Any, where: str = "value") -> bytes:
    """The bytes a value contributes (docs/spec/rng.md §5.2):

    - ``bytes``: as given;
    - an ``int``: ``uint64_be`` (0 to 2^64 - 1); a ``float``: binary64 big-endian;
    - an array (NumPy, or anything with ``__array__``, ``__dlpack__`` or
      ``.detach()`` such as PyTorch and CuPy): a kind byte ``f`` (every
      float type, as binary64), ``i`` (signed, as int64) or ``u``
      (unsigned and bool, as uint64), ``uint32_be(ndim)``, each dimension as
      ``uint64_be``, then the elements in C order, big-endian;
    - a mapping of text to values: ``uint64_be(count)``, then per entry in
      the order of the names' UTF-8 bytes ``uint32_be(len(name)) || name || encode(value)``;
    - a list or tuple: ``uint64_be(count)``, then each element's encoding.
    """
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, (int, np.integer)):  # bool too: refused
        return struct.pack(">Q", checks.integer(value, where, fail=_invalid, message=(
            "{name}: a bool is not a fingerprint value; use 0 or 1", "{name} must be in [0, 2^64 - 1], got {value}")))
    if isinstance(value, (float, np.floating)):
        return _binary64(float(value))
    if isinstance(value, Mapping):
        parts = [struct.pack(">Q", len(value))]
        names = []
        for name in value:
            checks.text(name, where, fail=_invalid, message="{name}: names must be text, got {value!r}")
            names.append((name.encode("utf-8"), name))
        for raw, name in sorted(names):
            parts.append(struct.pack(">I", len(raw)) + raw + encode(value[name], f"{where}.{name}"))
        return b"".join(parts)
    if isinstance(value, (list, tuple)):
        return struct.pack(">Q", len(value)) + b"".join(encode(item, f"{where}[{i}]") for i, item in enumerate(value))
    return _array_bytes(_as_numpy(value, where), where)


def _binary64(value: float) -> bytes:
    return CANONICAL_NAN if math.isnan(value) else struct.pack(">d", value)


def _as_numpy(value: Any, where: str) -> np.ndarray:
    if isinstance(value, np.ndarray):
        return value
    if hasattr(value, "detach"):  # PyTorch: leave autograd and the device; bfloat16 has no NumPy type
        tensor = value.detach().cpu()
        if tensor.is_floating_point():
            tensor = tensor.double()
        return tensor.numpy()
    if hasattr(value, "get") and hasattr(value, "__cuda_array_interface__"):  # CuPy
        return value.get()
    if hasattr(value, "__array__"):
        return np.asarray(value)
    raise _invalid(f"{where}: {type(value).__name__} is not a fingerprint value (bytes, int, float, array, "
                   "mapping of names to values, or list)")


def _array_bytes(array: np.ndarray, where: str) -> bytes:
    kind = array.dtype.kind
    if kind == "f":
        data = array.astype(">f8")
        flat = data.reshape(-1)
        nan = np.isnan(flat)
        if nan.any():
            flat = flat.copy()
            flat[nan] = np.frombuffer(CANONICAL_NAN, dtype=">f8")[0]
            data = flat
        code = b"f"
    elif kind == "i":
        data, code = array.astype(">i8"), b"i"
    elif kind in "ub":
        data, code = array.astype(">u8"), b"u"
    else:
        raise _invalid(f"{where}: arrays of dtype {array.dtype} are not hashed (float, signed, unsigned or bool only)")
    header = code + struct.pack(">I", array.ndim) + b"".join(struct.pack(">Q", d) for d in array.shape)
    return header + np.ascontiguousarray(data).tobytes()


def _invalid(message: str) -> UmlosError:
    return UmlosError(errors.FINGERPRINT_INPUT_INVALID, message, operator=OPERATOR)
