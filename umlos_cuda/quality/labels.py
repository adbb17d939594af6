"""The class of every sample, as stored: a synthetic class-sorted dataset or a user's label file.

The report measures an order by the classes it puts together in a batch, so it
needs ``labels[i]``, the class of the sample at index ``i`` in the dataset's
storage order. Two sources:

* :func:`class_sorted_labels`: N samples stored sorted into C equal classes
  (index ``i`` is in class ``i * C // N``), how corpora sorted by class,
  source, language or length sit on disk, the case where a weak shuffle shows;
* :func:`load_labels`: a ``.npy`` file of one class per sample (integers,
  booleans or strings; any values, renumbered ``0 .. C - 1`` in sorted order).

Either way the result is :class:`Labels`: dense class ids and the class names.
"""

from __future__ import annotations

import os
import zipfile
from dataclasses import dataclass

import numpy as np

from .. import checks, errors
from ..errors import QUALITY_OPERATOR as OPERATOR, UmlosError
from ..files import reader

#: Kinds of NumPy arrays accepted as labels: signed and unsigned integers, booleans, strings.
LABEL_KINDS = "iubUS"


@dataclass(frozen=True)
class Labels:
    """``ids[i]``: the class of sample ``i`` in ``[0, len(names))``; ``names``: each class's label as given."""

    ids: np.ndarray
    names: tuple[str, ...]
    source: str

    @property
    def n(self) -> int:
        return int(self.ids.size)

    @property
    def num_classes(self) -> int:
        return len(self.names)


def class_sorted_labels(n: int, classes: int) -> Labels:
    """``n`` samples stored sorted into ``classes`` classes of (nearly) equal size."""
    def refused(message: str) -> UmlosError:  # one message for both: the rule relates them
        return UmlosError(errors.INVALID_ARGUMENT, f"need 1 <= classes <= n, got classes={classes}, n={n}",
                          operator=OPERATOR)

    n = checks.integer(n, "n", 1, None, fail=refused)
    classes = checks.integer(classes, "classes", 1, n, fail=refused)
    dtype = np.uint16 if classes <= 1 << 16 else np.uint32 if classes <= 1 << 32 else np.uint64
    ids = (np.arange(n, dtype=np.uint64) * np.uint64(classes) // np.uint64(n)).astype(dtype)
    return Labels(ids, tuple(str(c) for c in range(classes)), f"{n:,} samples stored sorted into {classes} classes")


def load_labels(path: str | os.PathLike[str]) -> Labels:
    """The labels of a ``.npy`` file: a 1-D array of integers, booleans or strings, one per sample.

    Raises LABELS_UNREADABLE when the file is missing, not a regular file or
    not a ``.npy`` array (pickled object arrays are refused: loading them runs
    code), and LABELS_INVALID when the array is not 1-D, is empty, or holds
    another kind of value (floats, objects).
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise _unreadable(f"no label file at {path!r}")
    if not os.path.isfile(path):
        raise _unreadable(f"{path!r} is not a regular file")
    if zipfile.is_zipfile(path):
        raise _unreadable(f"{path!r} is a .npz archive; save one array with numpy.save(path, labels)")
    try:  # files/reader.py: a regular file whose header describes exactly its bytes; never unpickled
        array = reader.load_npy(path, lambda message: _unreadable(f"{message}; labels are a .npy array"), mmap=True)
    except FileNotFoundError:
        raise _unreadable(f"no label file at {path!r}") from None
    if array.ndim != 1:
        raise _invalid(f"{path!r} holds an array of shape {array.shape}; labels are one class per sample (1-D)")
    if array.size == 0:
        raise _invalid(f"{path!r} holds no labels")
    if array.dtype.kind not in LABEL_KINDS:
        raise _invalid(f"{path!r} holds {array.dtype} values; labels are integers, booleans or strings")
    names, ids = np.unique(np.asarray(array), return_inverse=True)
    dtype = np.uint16 if names.size <= 1 << 16 else np.uint32 if names.size <= 1 << 32 else np.uint64
    source = f"{os.path.basename(path)}: {array.size:,} samples in {names.size:,} classes"
    return Labels(ids.astype(dtype).ravel(), tuple(str(name) for name in names.tolist()), source)


def _unreadable(message: str) -> UmlosError:
    return UmlosError(errors.LABELS_UNREADABLE, message, operator=OPERATOR)


def _invalid(message: str) -> UmlosError:
    return UmlosError(errors.LABELS_INVALID, message, operator=OPERATOR)
