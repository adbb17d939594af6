"""The bounded reader's rules applied to objects: sizes before content, depth before parsing, headers against bytes.

What goes in: a :class:`~.client.RemoteObject` (its size recorded when opened) and an error factory, as
files/reader.py takes one, so that each artifact keeps its own documented code. What comes out: a JSON value
or a ``.npy`` file's data offset, by the same checks files/reader.py makes on a local file, with the same
functions (``check_size``, ``loads_json``, ``npy_header``, ``npy_expectation``, ``check_npy_bytes``):

* a JSON object over its cap is refused from its recorded size, before any GET of its body;
* a ``.npy`` object is never read whole to learn its layout: one GET of its first bytes (the header's
  largest allowed size) gives the dtype and shape, which must describe exactly the bytes after the header.
"""

from __future__ import annotations

import io
from typing import Any

from ..files import reader
from .client import RemoteObject

#: Bytes before a ``.npy`` header's text: magic (6), version (2), header length (4 in version 2.0).
_NPY_PREAMBLE = 12


def read_object_bytes(obj: RemoteObject, error: reader.ErrorFactory, *, max_bytes: int, what: str) -> bytes:
    """The bytes of ``obj``, refused (by ``error``, naming its URL) when its recorded size is over ``max_bytes``,
    before its body is fetched."""
    reader.check_size(obj.name, obj.size, max_bytes, what, error)
    return obj.read(0, obj.size)


def read_json_object(obj: RemoteObject, error: reader.ErrorFactory, *, max_bytes: int = reader.MAX_JSON_BYTES,
                     what: str = "JSON file") -> Any:
    """The JSON value of ``obj``, refused (by ``error``, naming its URL) when its recorded size is over
    ``max_bytes``, before its body is fetched, or when it nests deeper than the reader allows."""
    return reader.loads_json(read_object_bytes(obj, error, max_bytes=max_bytes, what=what), error, obj.name)


def npy_data_offset(obj: RemoteObject, dtype: str, count: int, error: reader.ErrorFactory, *,
                    expected: str = "expected") -> int:
    """Where the data of the ``.npy`` object ``obj`` begins, when its header says one-dimensional ``dtype`` of
    ``count`` elements and exactly that many bytes follow it; ``error`` otherwise."""
    head = obj.read(0, min(obj.size, _NPY_PREAMBLE + reader.MAX_NPY_HEADER_BYTES))
    handle = io.BytesIO(head)
    found, shape, _ = reader.npy_header(handle, obj.name, error)
    reader.npy_expectation(obj.name, dtype, (count,), error, expected)(found, shape)
    offset = handle.tell()
    reader.check_npy_bytes(obj.name, found, shape, obj.size - offset, error)
    return offset
