"""What a consumer checks before it trusts a plan folder.

Two levels, because they cost differently and guard different things:

* :func:`check_structure` runs on **every load** (``load_plan``). It checks
  what the reader itself relies on to hand out microbatches: offsets that
  start at 0, end at the sample count and rise strictly (no empty or
  negative microbatch, not only the first and last value; PLAN_FORMAT_INVALID),
  rows inside the plan's samples (PLAN_SAMPLES_INVALID), bucket ids inside
  the bucket spec (PLAN_BUCKET_MISMATCH), a packed plan's row bounds that
  tile each microbatch (PLAN_PACKS_INVALID), and a ``stats.json`` whose
  counts are those of the arrays (PLAN_STATS_MISMATCH: a sampler's
  ``len()`` and the cursor checks read them, so a forged count would make
  them lie). Vectorised over the arrays: memory-mapped reads in bounded
  windows, no per-sample object.
  A plan with a split or an over-long policy also has every entry checked
  to be one of its units (:func:`check_units`: a row on the split's side,
  a piece that row has), since the token ranges handed out follow from them.
* :func:`check_digests` runs on the paths that **derive new artifacts**
  from a plan (``plan shard``, ``batch generate``, ``batch check``; the
  commands' ``--no-verify`` skips it). A plan whose samples were swapped
  passes every structural check; only its content digests see it. It
  re-hashes ``lengths.npy``, the ids and every epoch's arrays and compares
  them with ``meta.json`` (PLAN_LENGTHS_MISMATCH,
  PLAN_FINGERPRINT_MISMATCH). ``plan verify`` does this and much more
  (every sample once, budgets, a rebuild).

* :func:`check_source_matches_plan` runs before tokens are read for a plan's
  microbatches (batch files, fingerprints, collation): the token source must
  hold the samples the plan was built from (BATCH_STORE_MISMATCH).
  :func:`check_rows_match_plan` is the same for any plan of rows the torch
  datasets read (a windowed plan binds its lengths: their count and SHA-256).

The digests live in the same folder as the arrays, so they catch a change
to any file made without recomputing them, not a folder rewritten
consistently by someone who can run this code: against that, compare the
fingerprint with one kept elsewhere (``plan verify --expected-fingerprint``).
"""

from __future__ import annotations

import numpy as np

from ... import checks, errors
from ...errors import MAX_WORLD_SIZE, UmlosError
from ...hashing import sha256_array
from ..lengths.fingerprints import DIFFERENT_TOKENIZER, tokenizer_difference
from .fingerprint import epoch_plan_digest, plan_fingerprint
from .plan import BatchPlan, plan_error
from .builder import sample_ids_sha256

#: Rows checked at a time for the range of ``samples`` (bounded temporaries on memory-mapped arrays).
_WINDOW = 1 << 22


def check_shard_field(shard, where: str) -> None:
    """A shard's ``rank`` and ``world_size`` are integers with ``0 <= rank < world_size <= 2^32 - 1``."""
    if shard is None:
        return
    rank, world_size = shard.get("rank"), shard.get("world_size")

    def refused(message: str) -> UmlosError:  # one message for both fields: the rule relates them
        return _format(f"{where}: shard rank {rank!r} and world_size {world_size!r} must be integers with "
                       f"0 <= rank < world_size <= {MAX_WORLD_SIZE}")

    world = checks.integer(world_size, "world_size", 1, MAX_WORLD_SIZE, strict=True, fail=refused)
    checks.integer(rank, "rank", 0, world - 1, strict=True, fail=refused)


def check_structure(folder: str, arrays: dict, stats, num_samples: int, num_buckets: int, shard) -> None:
    """Refuse (PLAN_FORMAT_INVALID, naming ``folder``) an epoch a reader cannot hand out as it is."""
    offsets, samples = arrays["offsets"], arrays["samples"]
    m = int(arrays["bucket_ids"].shape[0])
    s = int(samples.shape[0])
    if offsets.shape != (m + 1,) or arrays["max_len"].shape != (m,):
        raise _format(f"{folder}: offsets, samples, bucket_ids and max_len do not fit together "
                      f"({offsets.shape[0]} offsets for {m} microbatches)")
    steps = np.diff(np.asarray(offsets, dtype=np.int64))
    if int(offsets[0]) != 0 or int(offsets[-1]) != s or (m and int(steps.min()) < 1):
        bad = int(np.argmin(steps)) if m and int(steps.min()) < 1 else None
        where = f"; microbatch {bad} spans {int(steps[bad])} rows" if bad is not None else ""
        raise _format(f"{folder}/offsets.npy must rise strictly from 0 to the {s} rows of samples.npy{where}")
    for start in range(0, s, _WINDOW):
        part = np.asarray(samples[start:start + _WINDOW])
        if part.size and int(part.max()) >= num_samples:
            row = start + int(np.argmax(part))
            raise plan_error(errors.PLAN_SAMPLES_INVALID, f"{folder}/samples.npy: entry {row} names row "
                             f"{int(samples[row])}, past the plan's {num_samples} samples")
    buckets = np.asarray(arrays["bucket_ids"])
    if m and (int(buckets.min()) < 0 or int(buckets.max()) >= num_buckets):
        raise plan_error(errors.PLAN_BUCKET_MISMATCH,
                         f"{folder}/bucket_ids.npy holds a bucket id outside [0, {num_buckets - 1}]")
    if "pack_rows" in arrays:
        _check_packs(folder, arrays, m, s)
    if "pieces" in arrays and arrays["pieces"].shape != (s,):
        raise _format(f"{folder}/pieces.npy must hold one piece number per entry of samples.npy "
                      f"({arrays['pieces'].shape[0]} for {s})")
    _check_stats(folder, stats, m, s, shard)


def _check_packs(folder: str, arrays: dict, m: int, s: int) -> None:
    row_offsets = np.asarray(arrays["row_offsets"], dtype=np.int64)
    pack_rows = np.asarray(arrays["pack_rows"], dtype=np.int64)
    r = row_offsets.shape[0] - 1
    if pack_rows.shape != (m + 1,) or r < 0 or int(pack_rows[-1]) != r or int(row_offsets[-1]) != s:
        raise _format(f"{folder}: row_offsets and pack_rows do not fit the microbatches "
                      f"({pack_rows.shape[0]} row bounds for {m} microbatches)")
    if int(pack_rows[0]) != 0 or int(row_offsets[0]) != 0 or (m and int(np.diff(pack_rows).min()) < 1) \
            or (r and int(np.diff(row_offsets).min()) < 1) \
            or not np.array_equal(row_offsets[pack_rows], np.asarray(arrays["offsets"], dtype=np.int64)):
        raise plan_error(errors.PLAN_PACKS_INVALID, f"{folder}: row_offsets and pack_rows must rise strictly from 0 "
                         "and cut each microbatch's samples into non-empty rows")


def _check_stats(folder: str, stats, m: int, s: int, shard) -> None:
    """The counts a sampler's ``len()`` and a cursor check read must be those of the arrays."""
    where = f"{folder}/stats.json"
    checks.instance(stats, where, dict, fail=_format, message="{name} is not a stats object")

    def says(message: str) -> UmlosError:
        return _stats(f"{where} says {message}")

    for key, count in (("microbatches", m), ("samples", s)):
        checks.integer(stats.get(key), key, count, count, strict=True, fail=says,
                       message="{name} {value!r}; the epoch's arrays hold {low}")
    if shard is None:
        if "global_microbatches" in stats:
            raise _stats(f"{where} has global_microbatches, but meta.json says the plan is not a shard")
        return
    rank, world_size = shard["rank"], shard["world_size"]
    # rank holds microbatches rank, rank + world_size, ...: m of them when the epoch has low to high
    low, high = rank + (m - 1) * world_size + 1 if m else 0, rank + m * world_size
    checks.integer(stats.get("global_microbatches"), "global_microbatches", low, high, strict=True, fail=says,
                   message=f"{{name}} {{value!r}}; rank {rank} of {world_size} holds {m} of them, so the full epoch "
                           "has {low} to {high} microbatches")


def check_units(plan: BatchPlan, folder: str) -> None:
    """Every entry of a plan with a split or an over-long policy is one of its units (a row on the
    split's side, a piece the row has; PLAN_SAMPLES_INVALID naming the file): the token ranges a
    reader hands out are computed from them (:mod:`.units`)."""
    if plan.units is None:
        return
    for epoch in plan.epochs:
        for start in range(0, int(epoch.samples.shape[0]), _WINDOW):
            units, _ = plan.unit_index(epoch, start, start + _WINDOW)
            if units.size and int(units.min()) < 0:
                entry = start + int(np.argmin(units))
                name = "pieces.npy" if epoch.pieces is not None else "samples.npy"
                piece = "" if epoch.pieces is None else f" piece {int(epoch.pieces[entry])}"
                raise plan_error(errors.PLAN_SAMPLES_INVALID,
                                 f"{folder}/epoch_{epoch.epoch}/{name}: entry {entry} (row {int(epoch.samples[entry])}"
                                 f"{piece}) is no sample or piece that the plan's split and over-long policy keep")


def check_digests(plan: BatchPlan, folder: str) -> None:
    """The plan's content hashes to what ``meta.json`` records (see the module docstring)."""

    meta = plan.meta
    skip = "the plan changed after it was written: rebuild it, or pass --no-verify to use it as it is"
    if sha256_array(np.asarray(plan.lengths, dtype="<u4")) != meta.lengths_sha256:
        raise plan_error(errors.PLAN_LENGTHS_MISMATCH,
                         f"{folder}/lengths.npy does not hash to meta.json's lengths_sha256; {skip}")
    if plan.sample_ids is not None and sample_ids_sha256(plan.sample_ids) != meta.sample_ids_sha256:
        raise plan_error(errors.PLAN_LENGTHS_MISMATCH,
                         f"{folder}/sample_ids.jsonl does not hash to meta.json's sample_ids_sha256; {skip}")
    digests = tuple(epoch_plan_digest(e) for e in plan.epochs)
    fingerprint = plan_fingerprint(meta.header(), digests)
    if digests != meta.epoch_digests or fingerprint != meta.fingerprint:
        differ = [e for e, (a, b) in enumerate(zip(digests, meta.epoch_digests)) if a != b]
        what = f"epochs {differ} differ" if differ else "meta.json's fields differ"
        raise plan_error(errors.PLAN_FINGERPRINT_MISMATCH,
                         f"{folder}: the plan's content hashes to {fingerprint} but meta.json records "
                         f"{meta.fingerprint} ({what}); {skip}")


def _format(message: str) -> UmlosError:
    return plan_error(errors.PLAN_FORMAT_INVALID, message)


def _stats(message: str) -> UmlosError:
    return plan_error(errors.PLAN_STATS_MISMATCH, message)


def check_source_matches_plan(source, plan) -> None:
    """BATCH_STORE_MISMATCH unless ``source`` holds the samples ``plan`` was built from."""
    meta = plan.meta
    where = _where(source)
    if len(source) != meta.num_samples:
        raise _mismatch(f"{where} holds {len(source)} samples; the plan was built from {meta.num_samples}")
    if source.tokenizer_hash != meta.tokenizer_hash:
        raise _mismatch(f"{where} was tokenized by the tokenizer of fingerprint {source.tokenizer_hash}; the plan's "
                        f"lengths were counted by {meta.tokenizer_hash}: "
                        f"{tokenizer_difference(getattr(source, 'tokenizer_parts', None), meta.tokenizer_parts)}. "
                        "Tokenize the data again with the plan's tokenizer, or build the plan from this store")
    if sha256_array(np.asarray(source.lengths, dtype="<u4")) != meta.lengths_sha256:
        raise _mismatch(f"the lengths of {where} differ from those the plan was built from")
    if (meta.sample_ids_sha256 is None) != bool(source.ids_are_line_numbers):
        raise _mismatch(f"{where} names its samples {'by row number' if source.ids_are_line_numbers else 'by id'}; "
                        f"the plan {'by row number' if meta.sample_ids_sha256 is None else 'by id'}")
    if meta.sample_ids_sha256 is not None and \
            sample_ids_sha256(source.length_cache().sample_ids) != meta.sample_ids_sha256:
        raise _mismatch(f"the sample ids of {where} differ from those of the plan")


def check_rows_match_plan(source, plan) -> None:
    """BATCH_STORE_MISMATCH unless ``source`` holds the rows ``plan`` hands out: a whole plan's
    :func:`check_source_matches_plan`; any other plan of rows, each of its parts (``plan.row_parts()``: its one
    dataset, or a mixture's components one after another) in turn: its count, the SHA-256 of its lengths (from
    their binding, or from every length for lengths bound otherwise) and, where both name one, its tokenizer.
    A mixture's message names the component that differs, and its own source when ``source`` is a list of them
    (a ``SourceList``, one part per component: :func:`check_parts_match_plan`)."""
    if isinstance(plan, BatchPlan):
        check_source_matches_plan(source, plan)
        return
    parts = plan.row_parts()
    where = _where(source)
    total = sum(part.count for part in parts)
    if len(source) != total:
        counts = "" if len(parts) == 1 else f" ({', '.join(f'{part.name!r} {part.count}' for part in parts)})"
        raise _mismatch(f"{where} holds {len(source)} samples; the plan was built from {total}{counts}")
    pieces = getattr(source, "parts", None)
    if isinstance(pieces, list) and len(parts) > 1 and [p.count for p in pieces] == [p.count for p in parts]:
        check_parts_match_plan(pieces, plan)
        return
    start = 0
    for i, part in enumerate(parts):
        what = where if len(parts) == 1 else \
            f"component {i} ({part.name!r}) of the plan: rows {start} to {start + part.count - 1} of {where}"
        _check_part(part, source, start, len(parts) == 1, what)
        start += part.count


def check_parts_match_plan(pieces: list, plan) -> None:
    """BATCH_STORE_MISMATCH unless each of ``pieces`` (one source per part of ``plan``'s rows, in order: a
    mixture's component stores) holds its part: its count, its lengths and its tokenizer, as
    :func:`check_rows_match_plan`, the component and its source named."""
    parts = plan.row_parts()
    if len(pieces) != len(parts):
        raise _mismatch(f"{len(pieces)} token sources given for the plan's {len(parts)} datasets")
    for i, (part, piece) in enumerate(zip(parts, pieces)):
        what = f"component {i} ({part.name!r}) of the plan: {_where(piece)}"
        if piece.count != part.count:
            raise _mismatch(f"{what} holds {piece.count} samples; the plan was built from {part.count}")
        _check_part(part, piece, 0, True, what)


def _check_part(part, held, first: int, whole: bool, what: str) -> None:
    """One part's lengths (rows ``first ..`` of ``held``; ``whole``: all of them) and tokenizer against the plan's."""
    tokenizer = getattr(held, "tokenizer_hash", None)
    if part.tokenizer_hash is not None and tokenizer is not None and tokenizer != part.tokenizer_hash:
        raise _mismatch(f"{what} was tokenized by the tokenizer of fingerprint {tokenizer}; the plan's lengths "
                        f"were counted by {part.tokenizer_hash}: {DIFFERENT_TOKENIZER}")
    if _lengths_sha256(held, first, part.count, whole) != _bound_sha256(part):
        raise _mismatch(f"the lengths of {what} differ from those the plan was built from")


def _bound_sha256(part) -> str:
    """The SHA-256 of a part's lengths: its binding's, or hashed from its source for lengths bound otherwise."""
    if part.binding.get("kind") == "array":
        return part.binding["lengths_sha256"]
    return sha256_array(np.asarray(part.source.take(np.arange(part.count, dtype=np.int64)), dtype="<u4"))


def _lengths_sha256(source, start: int, count: int, whole: bool) -> str:
    """The SHA-256 of rows ``start .. start + count - 1``'s lengths in ``source``: its binding's when they are all
    of its rows (``whole``; hashed a piece at a time, cached), else from the lengths read by rows (``take``) or
    held (``lengths``)."""
    binding = getattr(source, "binding", None)
    if whole and callable(binding) and binding().get("kind") == "array":
        return binding()["lengths_sha256"]
    take = getattr(source, "take", None)
    lengths = take(np.arange(start, start + count, dtype=np.int64)) if callable(take) else \
        source.lengths[start:start + count]
    return sha256_array(np.asarray(lengths, dtype="<u4"))


def _where(source) -> str:
    where = getattr(source, "root", None) or getattr(source, "prefix", None) or type(source).__name__
    return " + ".join(map(str, where)) if isinstance(where, (list, tuple)) else str(where)


def _mismatch(message: str) -> UmlosError:
    return UmlosError(errors.BATCH_STORE_MISMATCH, message, operator=errors.BATCHING_OPERATOR)
