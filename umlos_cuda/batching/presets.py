"""Collation presets: one collated microbatch in the form a model or a loop takes.

What goes in: a :class:`~umlos_cuda.batching.collate.CollatedBatch` (or
anything with its six arrays) and a preset name. What comes out: a dict of
NumPy arrays (and, for ``padding_free``, two Python ints), under the names
and conventions its users already know:

* ``shifted`` (the collation's own arrays, for plain loops): the six arrays
  of the batch, targets already shifted (``labels[b, t]`` is the token that
  position ``t`` predicts), int32 unless ``dtype`` says otherwise. With the
  default dtype the arrays are the batch's own, byte for byte (batch files
  and batch fingerprints hold these).
* ``hf`` (what ``transformers`` causal LMs take): ``input_ids``,
  ``labels``, ``attention_mask``, ``position_ids``, int64 by default. The
  labels are *unshifted*: ``labels[b, t] = input_ids[b, t]`` where token
  ``t`` is trained on and has a predecessor in its own segment, else
  :data:`IGNORE_INDEX`; the model shifts them itself, so
  ``hf["labels"][:, 1:] == shifted["labels"][:, :-1]`` and column 0 is -100.
  ``attention_mask`` is ``[rows, width]`` (1 at tokens) for rows of single
  sequences and, for packed rows, the 4-D block-diagonal causal mask
  ``[rows, 1, width, width]`` of :mod:`~umlos_cuda.batching.attention_mask`
  (a plain 2-D mask over a packed row would let a token attend to the
  sequences before it in the row, so that is refused). ``transformers``
  uses a 4-D mask as it is: a boolean one (``mask_dtype="bool"``, True =
  attend) suits ``attn_implementation="sdpa"``; ``eager`` adds the mask to
  the attention scores and needs a float one (``mask_dtype="float32"``:
  0 where a token attends, the dtype's minimum elsewhere, in the model's
  dtype). It takes ``width**2`` values per row.
* ``padding_free`` (``transformers.DataCollatorWithFlattening(
  return_flash_attn_kwargs=True, return_position_ids=True)``'s keys and
  dtypes): every sequence of the microbatch (each segment of each row, in
  row order) concatenated into one row without padding: ``input_ids``,
  ``labels`` (unshifted, -100 at the first token of every sequence) and
  ``position_ids`` (restarting at 0 at every sequence) of shape ``[1,
  tokens]``, int64 by default; ``cu_seq_lens_q`` = ``cu_seq_lens_k``
  (``[0, end of sequence 0, end of sequence 1, ...]``, int32 by default,
  as variable-length attention kernels take them) and ``max_length_q`` =
  ``max_length_k`` (the longest sequence, a Python int).

Dtypes are chosen: ``dtype`` (int32 or int64) for the token, label, mask and
position arrays, ``cu_seq_lens_dtype`` for the boundaries. Everything here
is whole-array NumPy on the batch's arrays.
"""

from __future__ import annotations

import contextlib
from enum import Enum
from typing import Any

import numpy as np

from .. import checks, errors
from ..errors import UmlosError
from .attention_mask import create_segment_attention_mask

#: Label of a position that is not trained on (PyTorch's ``cross_entropy`` default ``ignore_index``).
IGNORE_INDEX = -100
#: Segment id of a padding position.
PAD_SEGMENT = -1
#: The forms of ``attention_mask`` the ``hf`` preset gives.
ATTENTION_FORMS = ("auto", "2d", "4d")
#: The dtypes a 4-D mask may have: boolean (True = attend) or additive float.
MASK_DTYPES = ("bool", "float16", "float32", "float64")
_INT_DTYPES = ("int32", "int64")


class CollationPreset(str, Enum):
    """The conventions a collated batch is handed out in (see the module docstring)."""

    SHIFTED = "shifted"
    HF = "hf"
    PADDING_FREE = "padding_free"

    @classmethod
    def parse(cls, value: Any) -> CollationPreset:
        if isinstance(value, cls):
            return value
        return cls(checks.choice(value, "preset", [p.value for p in cls], fail=preset_error))

    @property
    def default_dtype(self) -> np.dtype:
        """int32 for ``shifted`` (the collation's own arrays), int64 (what torch's embeddings and losses index
        with) otherwise."""
        return np.dtype(np.int32 if self is CollationPreset.SHIFTED else np.int64)


def apply_preset(batch: Any, preset: CollationPreset | str = CollationPreset.HF, *, dtype: Any = None,
                 attention: str = "auto", mask_dtype: str = "bool", cu_seq_lens_dtype: Any = "int32") -> dict[str, Any]:
    """``batch`` (a :class:`~umlos_cuda.batching.collate.CollatedBatch`) in the form ``preset`` names.

    Args:
        batch: the collated microbatch.
        preset: ``shifted``, ``hf`` or ``padding_free`` (:class:`CollationPreset`).
        dtype: int32 or int64 for the arrays; default int32 for ``shifted``, int64 otherwise.
        attention: ``hf`` only: ``2d``, ``4d``, or ``auto`` (4-D when a row holds more than one segment).
        mask_dtype: ``hf`` with a 4-D mask: ``bool`` (True = attend) or a float dtype (additive: 0 or the
            dtype's minimum).
        cu_seq_lens_dtype: ``padding_free`` only: int32 (what FlashAttention takes) or int64.
    """
    options = check_preset(preset, dtype=dtype, attention=attention, mask_dtype=mask_dtype,
                           cu_seq_lens_dtype=cu_seq_lens_dtype)
    preset, out_dtype, cu_dtype = options["preset"], options["dtype"], options["cu_seq_lens_dtype"]
    if preset is CollationPreset.SHIFTED:
        return {name: array.astype(out_dtype, copy=False) for name, array in batch.as_dict().items()}
    labels = unshifted_labels(batch.labels)
    if preset is CollationPreset.HF:
        return {"input_ids": batch.input_ids.astype(out_dtype), "labels": labels.astype(out_dtype),
                "attention_mask": _attention(batch, attention, options["mask_dtype"], out_dtype),
                "position_ids": batch.position_ids.astype(out_dtype)}
    return _padding_free(batch, labels, out_dtype, cu_dtype)


def check_preset(preset: CollationPreset | str, *, dtype: Any = None, attention: str = "auto",
                 mask_dtype: str = "bool", cu_seq_lens_dtype: Any = "int32") -> dict[str, Any]:
    """The arguments of :func:`apply_preset`, checked (COLLATE_INPUT_INVALID names the choices) and
    normalised: the preset as a :class:`CollationPreset`, dtypes as NumPy dtypes (``dtype`` filled in)."""
    preset = CollationPreset.parse(preset)
    checks.choice(attention, "attention", ATTENTION_FORMS, fail=preset_error)
    checks.choice(mask_dtype, "mask_dtype", MASK_DTYPES, fail=preset_error)
    return {"preset": preset, "dtype": preset.default_dtype if dtype is None else _int_dtype(dtype, "dtype"),
            "attention": attention, "mask_dtype": mask_dtype,
            "cu_seq_lens_dtype": _int_dtype(cu_seq_lens_dtype, "cu_seq_lens_dtype")}


def unshifted_labels(shifted: np.ndarray) -> np.ndarray:
    """The ``hf`` labels of shifted ones: moved one column right, -100 in column 0.

    A shifted label at ``t`` is token ``t + 1`` when that token is trained on
    and in ``t``'s segment; so the unshifted label at ``t + 1`` is the token
    itself under the same condition, which is what a model that shifts by
    itself needs."""
    shifted = np.asarray(shifted)
    labels = np.full(shifted.shape, IGNORE_INDEX, dtype=np.int64)
    labels[..., 1:] = shifted[..., :-1]
    return labels


def _padding_free(batch: Any, labels: np.ndarray, dtype: np.dtype, cu_dtype: np.dtype) -> dict[str, Any]:
    """The ``padding_free`` form: every sequence of the batch in one row, with its boundaries."""
    keep = np.asarray(batch.attention_mask) != 0
    if not keep.any():
        raise preset_error("the batch holds no tokens (attention_mask is 0 everywhere)")
    segments = np.asarray(batch.segment_ids)[keep]
    rows = np.nonzero(keep)[0]
    starts = np.ones(segments.shape[0], dtype=bool)
    starts[1:] = (segments[1:] != segments[:-1]) | (rows[1:] != rows[:-1])
    cu = np.append(np.flatnonzero(starts), segments.shape[0]).astype(np.int64)
    lengths = np.diff(cu)
    positions = np.arange(segments.shape[0], dtype=np.int64) - np.repeat(cu[:-1], lengths)
    flat_labels = labels[keep]
    flat_labels[cu[:-1]] = IGNORE_INDEX  # no token of its own sequence comes before it
    longest = int(lengths.max())
    return {"input_ids": np.asarray(batch.input_ids)[keep].astype(dtype)[None, :],
            "labels": flat_labels.astype(dtype)[None, :],
            "position_ids": positions.astype(dtype)[None, :],
            "cu_seq_lens_q": cu.astype(cu_dtype), "cu_seq_lens_k": cu.astype(cu_dtype),
            "max_length_q": longest, "max_length_k": longest}


def _attention(batch: Any, attention: str, mask_dtype: str, dtype: np.dtype) -> np.ndarray:
    segments = np.asarray(batch.segment_ids)
    packed = bool(segments.size) and int(segments.max()) > 0
    if attention == "2d" and packed:
        raise preset_error("a 2-D attention mask over a packed row lets each token attend to the sequences "
                           "before it in the row; use attention='4d' (the block-diagonal mask) or the "
                           "padding_free preset")
    if attention == "2d" or (attention == "auto" and not packed):
        return np.asarray(batch.attention_mask).astype(dtype)
    mask = create_segment_attention_mask(segments, framework="numpy")[:, None, :, :]
    if mask_dtype == "bool":
        return mask
    floats = np.dtype(mask_dtype)
    return np.where(mask, floats.type(0), np.finfo(floats).min).astype(floats)


def _int_dtype(value: Any, name: str) -> np.dtype:
    if type(value).__module__ == "torch":  # torch.int64 and the like: by name
        value = str(value).removeprefix("torch.")
    with contextlib.suppress(TypeError):  # not a dtype at all: refused below, naming the choices
        value = np.dtype(value).name
    return np.dtype(checks.choice(value, name, _INT_DTYPES, fail=preset_error))


def preset_error(message: str) -> UmlosError:
    return UmlosError(errors.COLLATE_INPUT_INVALID, message, operator=errors.BATCHING_OPERATOR)
