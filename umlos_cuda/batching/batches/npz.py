"""Batch files: one collated microbatch per ``.npz``, and the folder that holds them.

What goes in: a plan microbatch and its collated arrays. What comes out:
the file's name (``epoch_{e}_batch_{index:04d}.npz``, ``index``
the microbatch's global index), its exact bytes, and the check of a file
against its plan microbatch. The folder (docs/batching.md, "Batch files")::

    OUT/plan/                      the plan, as ``plan build`` writes it
    OUT/epoch_<e>_batch_<i>.npz    one per microbatch
    OUT/batches.json               what was written: plan, store, digests, batch fingerprint

In the ``npz`` layout (the seed's; layouts.py lists the others, which
share the folder and the file names), each ``.npz`` holds the six int32 arrays of
:class:`~umlos_cuda.batching.collate.CollatedBatch` and ``sample_ids``
(unicode), ``rows`` (int64 dataset rows), ``row_sizes`` (int64, the samples
of each array row: all 1, or a packed plan's samples per packed row, whose
segment ``k`` is the row's ``k``-th sample), ``bucket_id``, ``epoch``,
``index``, ``max_len`` (int64 scalars), ``plan_fingerprint`` and
``fingerprint``: this microbatch's content digest
(:func:`~umlos_cuda.batching.batches.fingerprint.microbatch_digest`, the unit
a batch fingerprint combines). The zip is written by hand, uncompressed,
members in a fixed order with a fixed timestamp, so the same plan and store
give byte-identical files on any machine: a finished file is verified by
comparing bytes.
"""

from __future__ import annotations

import io
import zipfile
from collections.abc import Mapping
from typing import Any

import numpy as np

from ... import errors
from ...errors import UmlosError
from ...files import reader
from .fingerprint import microbatch_digest
from ..collate import FIELDS, CollatedBatch, collate_arrays

FILES_FORMAT = "umlos_cuda.batch_files/1"
INDEX_FILE = "batches.json"
PLAN_FOLDER = "plan"
#: The members of a batch file, in the order they are written.
MEMBERS = FIELDS + ("sample_ids", "rows", "row_sizes", "bucket_id", "epoch", "index", "max_len", "plan_fingerprint",
                    "fingerprint")
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)


def batch_file_name(epoch: int, index: int, suffix: str = ".npz") -> str:
    """The file name of global microbatch ``index`` of ``epoch`` (``suffix``: the layout's, layouts.py)."""
    return f"epoch_{int(epoch)}_batch_{int(index):04d}{suffix}"


def file_arrays(epoch: int, microbatch: Any, batch: CollatedBatch, plan_fingerprint: str | None,
                digest: str | None = None) -> dict[str, np.ndarray]:
    """Every member of the batch file of ``microbatch``, in :data:`MEMBERS` order; ``digest``: its content
    digest when the caller has it already (hashing a microbatch again costs as much as writing it)."""
    arrays: dict[str, np.ndarray] = batch.as_dict()
    if digest is None:
        digest = microbatch_digest(batch.input_ids, batch.loss_mask)
    arrays.update(plan_members(epoch, microbatch, plan_fingerprint, digest))
    return arrays


def plan_members(epoch: int, microbatch: Any, plan_fingerprint: str | None, digest: str) -> dict[str, np.ndarray]:
    """The members after the six arrays, in :data:`MEMBERS` order: what the plan says of
    ``microbatch`` and its content ``digest`` (a compact file's reader builds them from the plan)."""
    arrays = {"sample_ids": np.array(list(microbatch.samples), dtype=str),
              "rows": np.asarray(microbatch.rows, dtype=np.int64), "row_sizes": row_sizes(microbatch)}
    for name, value in (("bucket_id", microbatch.bucket_id), ("epoch", epoch), ("index", microbatch.index),
                        ("max_len", microbatch.max_len)):
        arrays[name] = np.array(int(value), dtype=np.int64)
    arrays["plan_fingerprint"] = np.array(plan_fingerprint)
    arrays["fingerprint"] = np.array(digest)
    return arrays


def row_sizes(microbatch: Any) -> np.ndarray:
    """Samples per array row of ``microbatch``: its packed rows' sizes, or one per sample."""
    sizes = getattr(microbatch, "pack_sizes", None)
    if sizes is None:
        return np.ones(len(microbatch.samples), dtype=np.int64)
    return np.asarray(sizes, dtype=np.int64)


def npz_bytes(arrays: Mapping[str, np.ndarray]) -> bytes:
    """The ``.npz`` bytes of ``arrays``: stored (uncompressed) members, fixed timestamp, given order."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        for name, array in arrays.items():
            info = zipfile.ZipInfo(f"{name}.npy", date_time=_ZIP_TIME)
            info.compress_type = zipfile.ZIP_STORED
            info.external_attr = 0o644 << 16
            with archive.open(info, "w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.asarray(array), allow_pickle=False)
    return buffer.getvalue()


def read_batch_file(path: str) -> dict[str, np.ndarray]:
    """Every member of the batch file at ``path`` (BATCH_FILE_INVALID when it is
    missing, not a regular file, not a readable ``.npz``, or holds other members
    than :data:`MEMBERS`, stored, each the size its header says: files/reader.py)."""
    try:
        return reader.read_npz(path, MEMBERS, file_error)
    except FileNotFoundError:
        raise file_error(f"{path} is missing (run `umlos-cuda batch generate` again to write it)") from None


def check_batch_file(path: str, arrays: Mapping[str, np.ndarray], epoch: int, microbatch: Any,
                     plan_fingerprint: str, digest: str | None = None, *, pad_id: int = 0) -> None:
    """BATCH_FILE_INVALID unless the file's arrays are those of ``microbatch``:
    epoch, index, rows, ids, bucket and pad length as the plan says, the
    six arrays of that shape and consistent with each other (recollated
    from the file's own tokens, masks and segments), and its content digest
    equal to its ``fingerprint`` member and to ``digest`` when given."""
    def scalar(name: str):
        return arrays[name].item() if arrays[name].shape == () else None

    expected = {"epoch": epoch, "index": microbatch.index, "bucket_id": microbatch.bucket_id,
                "max_len": microbatch.max_len, "plan_fingerprint": plan_fingerprint}
    for name, value in expected.items():
        if scalar(name) != value:
            raise file_error(f"{path}: {name} is {scalar(name)!r}; the plan's microbatch has {value!r}")
    sizes = row_sizes(microbatch)
    if not np.array_equal(arrays["rows"], np.asarray(microbatch.rows)) or \
            arrays["sample_ids"].tolist() != list(microbatch.samples) or not np.array_equal(arrays["row_sizes"], sizes):
        raise file_error(f"{path} holds other samples than the plan's epoch {epoch} microbatch {microbatch.index}")
    shape = (int(sizes.shape[0]), int(microbatch.max_len))
    for name in FIELDS:
        if arrays[name].shape != shape or arrays[name].dtype != np.int32:
            raise file_error(f"{path}: {name} is {arrays[name].dtype} {arrays[name].shape}; expected int32 {shape}")
    batch = CollatedBatch.from_dict(arrays)
    lengths = batch.attention_mask.sum(axis=1)
    spans = list(enumerate(lengths.tolist()))
    try:
        again = collate_arrays([batch.input_ids[b, :n] for b, n in spans], [batch.loss_mask[b, :n] for b, n in spans],
                               shape[1], pad_id=pad_id, segment_ids=[batch.segment_ids[b, :n] for b, n in spans])
    except UmlosError as exc:
        raise file_error(f"{path}: {exc.message}") from None
    if not np.array_equal(batch.segment_ids.max(axis=1).astype(np.int64) + 1, sizes):
        raise file_error(f"{path}: the segments of its rows do not match row_sizes")
    for name in FIELDS:
        if not np.array_equal(getattr(again, name), arrays[name]):
            raise file_error(f"{path}: {name} is not consistent with the file's tokens, masks and segments")
    content = microbatch_digest(batch.input_ids, batch.loss_mask)
    recorded = scalar("fingerprint")
    if content != recorded or (digest is not None and content != digest):
        raise file_error(f"{path}: its tokens and loss mask hash to {content}; the file records {recorded}"
                         + (f" and {INDEX_FILE} {digest}" if digest is not None else ""))


def file_error(message: str) -> UmlosError:
    return UmlosError(errors.BATCH_FILE_INVALID, message, operator=errors.BATCHING_OPERATOR)
