"""Tensor shards and array artifacts in the safetensors format (via its NumPy API).

safetensors is a standard, documented format (an 8-byte little-endian header
length, a JSON header of ``{name: {dtype, shape, data_offsets}}``, then raw
little-endian data) whose reader never executes anything; its serialiser is
deterministic (tensors ordered by alignment, then name), which the golden
container test pins. Before the library sees untrusted bytes, :func:`describe`
checks the header against the file (bounded size, known dtypes, offsets that
tile the data exactly), so malformed shards fail with
``CHECKPOINT_CONTENT_INVALID`` and a message rather than a library error.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from functools import partial
from typing import Any

import numpy as np

from .. import checks, errors
from ..errors import UINT64_MAX
from . import limits
from .codes import SERIALIZE, error
from .schema import utf8_length

#: safetensors dtype names and their NumPy types (those NumPy can hold).
DTYPES = {
    "BOOL": np.dtype(np.bool_),
    "U8": np.dtype(np.uint8),
    "I8": np.dtype(np.int8),
    "U16": np.dtype(np.uint16),
    "I16": np.dtype(np.int16),
    "U32": np.dtype(np.uint32),
    "I32": np.dtype(np.int32),
    "U64": np.dtype(np.uint64),
    "I64": np.dtype(np.int64),
    "F16": np.dtype(np.float16),
    "F32": np.dtype(np.float32),
    "F64": np.dtype(np.float64),
}
_ALLOWED_NUMPY = set(DTYPES.values())
#: Bound on a shard's JSON header (the format's own reader allows 100 MB).
MAX_HEADER_BYTES = limits.MAX_SAFETENSORS_HEADER_BYTES
MAX_TENSOR_NAME_BYTES = limits.MAX_TENSOR_NAME_BYTES
MAX_DIMS = limits.MAX_DIMS


def name_problem(name: Any) -> str | None:
    """Why ``name`` cannot name a tensor (None if it can). Writer and reader
    share this rule: non-empty UTF-8 text (no lone surrogates, which the
    safetensors library refuses) of at most MAX_TENSOR_NAME_BYTES bytes, not
    ``__metadata__``."""
    if not isinstance(name, str):
        return f"tensor name {name!r} is not text"
    length = utf8_length(name)
    if length is None:
        return f"tensor name {name!r} holds a lone surrogate (not UTF-8)"
    if not 0 < length <= MAX_TENSOR_NAME_BYTES or name == "__metadata__":
        return f"tensor name {name!r} must be non-empty text of at most {MAX_TENSOR_NAME_BYTES} bytes, not __metadata__"
    return None


def encode(arrays: Mapping[str, Any], what: str) -> bytes:
    """safetensors bytes of ``{name: ndarray}``; refuse what cannot round-trip exactly."""
    import safetensors.numpy

    fail = partial(error, errors.CHECKPOINT_STATE_INVALID, operator=SERIALIZE)
    checks.instance(arrays, what, Mapping, fail=fail, message="{name}: expected a mapping of name to array")
    prepared = {}
    for name, array in arrays.items():
        problem = name_problem(name)
        if problem is not None:
            raise error(errors.CHECKPOINT_STATE_INVALID, f"{what}: {problem}", operator=SERIALIZE)
        checks.instance(array, f"{what}: {name!r}", np.ndarray, fail=fail,
                        message="{name} is a {type}, not a NumPy array")
        if array.dtype.newbyteorder("=") not in _ALLOWED_NUMPY:
            raise error(
                errors.CHECKPOINT_STATE_INVALID,
                f"{what}: {name!r} has dtype {array.dtype}; allowed: "
                f"{', '.join(sorted(str(d) for d in _ALLOWED_NUMPY))}",
                operator=SERIALIZE,
            )
        if array.ndim > MAX_DIMS:
            raise error(errors.CHECKPOINT_STATE_INVALID, f"{what}: {name!r} has more than {MAX_DIMS} dimensions",
                        operator=SERIALIZE)
        prepared[name] = np.ascontiguousarray(array.astype(array.dtype.newbyteorder("<"), copy=False))
    try:
        data = safetensors.numpy.save(prepared)
    except Exception as exc:  # the library's own refusal, reported with our code
        raise error(errors.CHECKPOINT_STATE_INVALID, f"{what}: cannot serialise: {exc}", operator=SERIALIZE) from None
    try:
        describe(data, what)  # the reader's checks: what a reader refuses is never written
    except errors.UmlosError as exc:
        raise error(errors.CHECKPOINT_STATE_INVALID, f"readers would refuse it: {exc.message}",
                    operator=SERIALIZE) from None
    return data


def _object(pairs: list) -> dict:
    out = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def _unsigned(text: str) -> int:
    if text.startswith("-"):  # -0 too
        raise ValueError(f"number {text} is negative")
    return checks.integer_text(text, "number", 0, UINT64_MAX, fail=ValueError,
                               message="number {value} is not an unsigned integer of at most 64 bits")


def _not_an_integer(text: str):
    raise ValueError(f"number {text} is not an unsigned integer")


def _parse_header(text: str) -> Any:
    """JSON as the safetensors library reads it: no repeated keys, integers
    only (no ``-0``, fractions, exponents, NaN or infinities)."""
    return json.loads(text, object_pairs_hook=_object, parse_int=_unsigned, parse_float=_not_an_integer,
                      parse_constant=_not_an_integer)


def _all_text_encodable(value: Any) -> bool:
    if isinstance(value, str):
        return utf8_length(value) is not None
    if isinstance(value, dict):
        return all(_all_text_encodable(k) and _all_text_encodable(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_all_text_encodable(v) for v in value)
    return True


_METADATA = "__metadata__ must map text to text"
#: A tensor's entry in the header; the reader checks each value below.
_TENSOR = dict.fromkeys(("dtype", "shape", "data_offsets"), checks.field(checks.anything))
_TENSOR_KEYS = "tensor {what} must have exactly dtype, shape and data_offsets"
_SHAPE = "tensor {name} has an invalid shape"
_OFFSETS = "tensor {name} has data_offsets outside the data"


def describe(data: bytes, what: str) -> dict[str, dict[str, Any]]:
    """Validate a safetensors file's header against its bytes; return
    ``{name: {"dtype", "shape", "nbytes"}}`` in the file's order."""

    def bad(reason: str):
        return error(errors.CHECKPOINT_CONTENT_INVALID, f"{what}: not a valid safetensors file: {reason}")

    if len(data) < 8:
        raise bad("shorter than the 8-byte header length")
    header_len = int.from_bytes(data[:8], "little")
    if header_len > MAX_HEADER_BYTES or header_len > len(data) - 8:
        raise bad(f"header length {header_len} exceeds the file or the {MAX_HEADER_BYTES}-byte limit")
    try:
        header = _parse_header(data[8 : 8 + header_len].decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise bad(f"header is not JSON: {exc}") from None
    checks.instance(header, "header", dict, fail=bad, message="{name} is not a JSON object")
    if not _all_text_encodable(header):
        raise bad("header text holds a lone surrogate escape (not UTF-8)")
    body = len(data) - 8 - header_len
    spans = []
    out: dict[str, dict[str, Any]] = {}
    for name, info in header.items():
        if name == "__metadata__":
            for text in checks.instance(info, name, dict, fail=bad, message=_METADATA).values():
                checks.text(text, name, fail=bad, message=_METADATA)
            continue
        problem = name_problem(name)
        if problem is not None:
            raise bad(problem)
        shown = repr(name)
        checks.record(info, _TENSOR, fail=bad, what=shown, not_a_map=_TENSOR_KEYS, unknown=_TENSOR_KEYS,
                      missing=_TENSOR_KEYS)
        dtype = checks.choice(info["dtype"], shown, DTYPES, fail=bad,
                              message="tensor {name} has dtype {value!r}; readable: {choices}")
        shape = checks.instance(info["shape"], shown, list, max_length=MAX_DIMS, fail=bad, message=_SHAPE)
        for size in shape:
            checks.integer(size, shown, 0, (1 << 62) - 1, strict=True, fail=bad, message=_SHAPE)
        offsets = checks.instance(info["data_offsets"], shown, list, length=2, fail=bad, message=_OFFSETS)
        start = checks.integer(offsets[0], shown, 0, None, strict=True, fail=bad, message=_OFFSETS)
        checks.integer(offsets[1], shown, start, body, strict=True, fail=bad, message=_OFFSETS)
        nbytes = math.prod(shape) * DTYPES[dtype].itemsize
        if offsets[1] - offsets[0] != nbytes:
            raise bad(f"tensor {name!r}: {offsets[1] - offsets[0]} data bytes for shape {shape} of {dtype}")
        spans.append(tuple(offsets))
        out[name] = {"dtype": dtype, "shape": list(shape), "nbytes": nbytes}
    position = 0
    for start, end in sorted(spans):
        if start != position:
            raise bad("tensor data overlaps or leaves gaps")
        position = end
    if position != body:
        raise bad("tensor data does not end at the end of the file")
    return out


def decode(data: bytes, what: str) -> dict[str, np.ndarray]:
    """``{name: ndarray}`` from validated safetensors bytes (arrays own their memory)."""
    import safetensors.numpy

    describe(data, what)
    try:
        loaded = safetensors.numpy.load(data)
    except Exception as exc:  # the library's refusal, reported with our code
        raise error(errors.CHECKPOINT_CONTENT_INVALID, f"{what}: not a valid safetensors file: {exc}") from None
    return {name: np.array(array, copy=True) for name, array in loaded.items()}
