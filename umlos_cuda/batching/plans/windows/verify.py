"""Check a windowed plan folder: the definition, the lengths, and any sample of its windows replanned.

What goes in: a windowed plan folder (:mod:`.io`), optionally the lengths, how many windows to
check (``windows=None``: all of them) and a seed for choosing them. What comes out:
``{"fingerprint", "checks", "windows_checked"}``, or the first failure as an
:class:`~umlos_cuda.UmlosError` with its code. The checks, in order:

1. the folder opens: meta.json and index.npy are well formed, the index's running totals cover
   every position of each epoch, the engine's order is the one recorded, and the definition and
   index hash to meta.json's fingerprint (PLAN_NOT_FOUND, PLAN_FORMAT_INVALID,
   PLAN_NOT_REPRODUCIBLE, PLAN_FINGERPRINT_MISMATCH); ``expected_fingerprint`` when given;
2. the lengths' bytes hash to the SHA-256 the plan binds (PLAN_LENGTHS_MISMATCH): a mapped
   sidecar's bytes are read once, at disk speed, a window at a time;
3. each chosen window of each epoch, planned again: its counts are the index's
   (PLAN_NOT_REPRODUCIBLE); its planned and skipped rows are exactly the rows of its positions,
   each once, and the skipped ones exactly those no bucket accepts (PLAN_SAMPLES_INVALID); each
   microbatch's samples are of its bucket (PLAN_BUCKET_MISMATCH) and ``count x max_len`` within
   the budget (PLAN_BUDGET_EXCEEDED); in a packed plan ``rows x max_length`` within the budget and
   each row within ``max_length`` tokens (PLAN_PACKS_INVALID, :mod:`.packed`).

A sample of ``s`` windows costs ``s`` windows an epoch; all of them cost a pass over the plan.
:func:`verify_mixed_plan`, :func:`verify_sequences` and :func:`verify_mixed_sequences` run the same kind of
checks on mixed plans, pretraining sequences folders and their mixtures.
"""

from __future__ import annotations

import numpy as np

from .... import errors
from ..plan import plan_error
from .io import load_mixed_plan, load_windowed_plan
from .cut import window_documents
from .packed import check_window_rows, padded_rows
from .sequences_io import load_mixed_sequences, load_sequences
from ...lengths.sources import MappedLengths, SyntheticLengths
from .window import COUNT_FIELDS, window_rows


def verify_windowed_plan(directory, *, windows: int | None = None, seed: int = 0, lengths=None,
                         expected_fingerprint: str | None = None) -> dict:
    """Run the checks of the module docstring on the plan in ``directory``."""
    plan = load_windowed_plan(directory, lengths=lengths)
    checks = ["opens: definition, index and fingerprint agree"]
    _expect_fingerprint(directory, plan.fingerprint, expected_fingerprint, "plan's")
    source = plan.source
    if isinstance(source, MappedLengths):
        source.check_bytes()
        checks.append("the mapped lengths hash to their binding")
    elif not isinstance(source, SyntheticLengths):  # in memory, or read by rows (a token source's)
        checks.append("the lengths hash to their binding")  # load_windowed_plan compared the binding
    return _check_windows(plan, checks, windows, seed, _check_window,
                          "windows of every epoch replanned: counts, samples, buckets, budgets")


def _check_window(plan, epoch: int, w: int) -> None:
    where = f"epoch {epoch} window {w}"
    definition, config = plan.definition, plan.config
    arrays = plan.window(epoch, w)
    lengths = plan.source.take(arrays.samples)
    _check_counts(arrays, lengths, plan.index[epoch, w + 1] - plan.index[epoch, w], where)
    rows = np.sort(window_rows(definition, epoch, w, plan.backend))
    held = np.sort(np.concatenate((arrays.samples, arrays.skipped)))
    if not np.array_equal(rows, held):
        raise plan_error(errors.PLAN_SAMPLES_INVALID, f"{where}: its microbatches and skipped samples are not the "
                                                      "rows of its positions, each once")
    if arrays.skipped.size and np.any(config.bucket_spec.bucket_ids(plan.source.take(arrays.skipped)) >= 0):
        raise plan_error(errors.PLAN_SAMPLES_INVALID, f"{where}: a skipped sample is of a bucket")
    _check_microbatches(arrays, lengths, config, where)
    if definition.local_reads:
        plan.source.release()


def verify_mixed_plan(directory, *, windows: int | None = None, seed: int = 0, lengths=None,
                      expected_fingerprint: str | None = None) -> dict:
    """The checks above for a mixed plan folder (docs/batching.md, "Weighted mixtures"): it opens and
    hashes to its fingerprint; each mapped sidecar's bytes hash to its binding; each chosen mixed window,
    planned again, holds each component at its quota (PLAN_NOT_REPRODUCIBLE), its counts are the index's,
    its microbatches and skipped samples are its positions, each once (PLAN_SAMPLES_INVALID), and the
    buckets, budgets and a packed plan's rows (:mod:`.packed`) hold."""
    plan = load_mixed_plan(directory, lengths=lengths)
    checks = ["opens: definition, index and fingerprint agree"]
    _expect_fingerprint(directory, plan.fingerprint, expected_fingerprint, "plan's")
    definition = plan.definition
    for source in definition.sources:
        if isinstance(source, MappedLengths):
            source.check_bytes()
    checks.append("every component's lengths hash to their binding")
    total = definition.num_windows
    chosen = chosen_windows(total, windows, seed)
    for m in chosen.tolist():
        _check_mixed_window(plan, m)
    checks.append(f"{chosen.shape[0]} of {total} mixed windows replanned: quotas, counts, samples, buckets, budgets")
    return {"fingerprint": plan.fingerprint, "checks": checks, "windows_checked": int(chosen.shape[0])}


def _check_mixed_window(plan, m: int) -> None:
    where = f"mixed window {m}"
    definition, config = plan.definition, plan.definition.config
    planned = plan.window(m)
    arrays, mixed = planned.arrays, planned.mixed
    quotas = np.bincount(mixed.component, minlength=len(definition.components)).tolist()
    if quotas != list(definition.quotas(m)):
        raise plan_error(errors.PLAN_NOT_REPRODUCIBLE, f"{where}: it holds {quotas} samples of the components; "
                                                       f"the quotas are {list(definition.quotas(m))}")
    window_lengths = mixed.lengths(definition.sources)
    base = m * definition.window
    lengths = window_lengths[(arrays.samples - np.uint64(base)).astype(np.int64)]
    _check_counts(arrays, lengths, plan.index[0, m + 1] - plan.index[0, m], where)
    held = np.sort(np.concatenate((arrays.samples, arrays.skipped)))
    if not np.array_equal(held, np.arange(base, base + window_lengths.shape[0], dtype=np.uint64)):
        raise plan_error(errors.PLAN_SAMPLES_INVALID, f"{where}: its microbatches and skipped samples are not its "
                                                      "positions, each once")
    _check_microbatches(arrays, lengths, config, where)


def _check_counts(arrays, lengths: np.ndarray, stored: np.ndarray, where: str) -> None:
    """PLAN_NOT_REPRODUCIBLE unless a window planned again has the index's counts (:data:`COUNT_FIELDS`)."""
    padded = int((padded_rows(arrays) * np.asarray(arrays.max_len, dtype=np.int64)).sum())
    got = (int(arrays.offsets.shape[0]) - 1, int(arrays.samples.shape[0]), int(arrays.skipped.shape[0]),
           int(lengths.sum(dtype=np.uint64)), padded)
    if got != tuple(int(v) for v in stored):
        differ = [name for name, a, b in zip(COUNT_FIELDS, got, stored) if a != int(b)]
        raise plan_error(errors.PLAN_NOT_REPRODUCIBLE, f"{where}: replanned, it differs from the index in {differ}")


def _check_microbatches(arrays, lengths: np.ndarray, config, where: str) -> None:
    """A window's microbatches keep the config's rules: every sample of its microbatch's bucket
    (PLAN_BUCKET_MISMATCH), a packed plan's rows (:mod:`.packed`), the token budget (PLAN_BUDGET_EXCEEDED)."""
    sizes = np.diff(arrays.offsets)
    if np.any(config.bucket_spec.bucket_ids(lengths) != np.repeat(arrays.bucket_ids, sizes)):
        raise plan_error(errors.PLAN_BUCKET_MISMATCH, f"{where}: a microbatch holds a sample of another bucket")
    check_window_rows(arrays, lengths, config, where)
    padded_by = padded_rows(arrays)  # samples, or a packed plan's rows
    max_len = np.asarray(arrays.max_len, dtype=np.int64)
    over = np.flatnonzero(padded_by * max_len > config.token_budget)
    if over.size:
        j = int(over[0])
        raise plan_error(errors.PLAN_BUDGET_EXCEEDED, f"{where}: microbatch {j} holds {int(padded_by[j])} x "
                                                      f"{int(max_len[j])} tokens; the budget is {config.token_budget}")


def verify_sequences(directory, *, windows: int | None = None, seed: int = 0, lengths=None, tokens=None,
                     expected_fingerprint: str | None = None) -> dict:
    """The checks above for a pretraining sequences folder (docs/batching.md, "Pretraining sequences"): it
    opens (:func:`~.sequences_io.load_sequences`: definition, index, lengths' binding, engine order and
    fingerprint agree); mapped lengths hash to their binding, a Megatron pair's every size and pointer is
    checked (every document can be read); each chosen window of each epoch, read again
    from the engine's order, holds distinct rows whose stream lengths are their documents' lengths (plus
    the EOS) (PLAN_SAMPLES_INVALID) and sum to the index's count (PLAN_NOT_REPRODUCIBLE)."""
    plan = load_sequences(directory, tokens=tokens, lengths=lengths)
    checks = ["opens: definition, index, lengths and fingerprint agree"]
    _expect_fingerprint(directory, plan.fingerprint, expected_fingerprint, "sequences'")
    _check_source(plan.lengths, checks)
    return _check_windows(plan, checks, windows, seed, _check_sequences_window,
                          "windows of every epoch recounted from the lengths")


def _check_sequences_window(plan, epoch: int, w: int) -> None:
    where = f"epoch {epoch} window {w}"
    definition = plan.definition
    rows, sizes = window_documents(definition, plan.lengths, epoch, w, plan.backend)
    start, stop = definition.bounds(w)
    if rows.shape[0] != stop - start or np.unique(rows).shape[0] != rows.shape[0] or \
            (rows.size and (int(rows.min()) < 0 or int(rows.max()) >= definition.num_documents)):
        raise plan_error(errors.PLAN_SAMPLES_INVALID, f"{where}: its documents are not {stop - start} distinct rows")
    own = np.asarray(plan.lengths.take(rows), dtype=np.int64) + definition.extra
    if not np.array_equal(np.asarray(sizes, dtype=np.int64), own):
        raise plan_error(errors.PLAN_SAMPLES_INVALID, f"{where}: its stream lengths are not its documents' lengths")
    stored = int(plan.index[epoch, w + 1] - plan.index[epoch, w])
    if int(own.sum()) != stored:
        raise plan_error(errors.PLAN_NOT_REPRODUCIBLE, f"{where}: recounted, it holds {int(own.sum())} stream "
                                                       f"tokens; the index says {stored}")


def _check_source(source, checks: list[str], what: str = "the") -> None:
    """What a mapped source's own bytes can prove, appended to ``checks``: a sidecar's lengths hash to their
    binding; a Megatron pair's every size and pointer lies inside its ``.bin``."""
    if hasattr(source, "check_bytes"):
        source.check_bytes()
        checks.append(f"{what} mapped lengths hash to their binding")
    if hasattr(source, "check_rows"):
        source.check_rows()
        checks.append(f"{what} Megatron pair's every size and pointer lies inside its .bin")


def verify_mixed_sequences(directory, *, windows: int | None = None, seed: int = 0, lengths=None, tokens=None,
                           expected_fingerprint: str | None = None) -> dict:
    """The checks above for a mixture of pretraining sequences (docs/batching.md, "Mixtures of pretraining
    sequences"): it opens (:func:`~.sequences_io.load_mixed_sequences`: every component as a sequences folder
    opens, then the mixture's header and fingerprint); mapped lengths hash to their binding; each chosen mixed
    window, merged again, holds each component exactly at its quota and its stream positions ``start ..
    start + q - 1`` in order, each once, inside the epochs its index holds (PLAN_NOT_REPRODUCIBLE); and the
    chosen windows of every epoch of every component are recounted as :func:`verify_sequences` does."""
    mixture = load_mixed_sequences(directory, tokens=tokens, lengths=lengths)
    checks = ["opens: every component's definition, index, lengths and fingerprint, and the mixture's, agree"]
    _expect_fingerprint(directory, mixture.fingerprint, expected_fingerprint, "mixture's")
    for component in mixture.components:
        _check_source(component.sequences.lengths, checks, f"{component.name}'s")
    total = mixture.num_windows
    chosen = chosen_windows(total, windows, seed)
    for m in chosen.tolist():
        _check_mixed_sequences_window(mixture, m)
    checks.append(f"{chosen.shape[0]} of {total} mixed windows merged again: quotas, each stream in order, once")
    for component in mixture.components:
        _check_windows(component.sequences, checks, windows, seed, _check_sequences_window,
                       f"windows of every epoch of {component.name!r} recounted from the lengths")
    return {"fingerprint": mixture.fingerprint, "checks": checks, "windows_checked": int(chosen.shape[0])}


def _check_mixed_sequences_window(mixture, m: int) -> None:
    where = f"mixed window {m}"
    component, position = mixture.blend.merge(m)
    quotas, starts = mixture.blend.quotas(m), mixture.blend.stream_starts(m)
    held = np.bincount(component, minlength=len(mixture.components)).tolist()
    if held != list(quotas):
        raise plan_error(errors.PLAN_NOT_REPRODUCIBLE, f"{where}: it holds {held} samples of the components; the "
                                                       f"quotas are {list(quotas)}")
    for i, (start, q) in enumerate(zip(starts, quotas)):
        own = position[component == i]
        if not np.array_equal(own, np.arange(start, start + q, dtype=np.int64)):
            raise plan_error(errors.PLAN_NOT_REPRODUCIBLE, f"{where}: component {i}'s samples are not its stream "
                                                           f"positions {start} to {start + q - 1} in order")
        sequences = mixture.components[i].sequences
        if q and start + q > sequences.num_epochs * mixture.per_epoch[i]:
            raise plan_error(errors.PLAN_NOT_REPRODUCIBLE, f"{where}: component {i} is read past the "
                                                           f"{sequences.num_epochs} epoch(s) its index holds")


def chosen_windows(total: int, windows: int | None, seed: int) -> np.ndarray:
    """The windows ``plan verify --windows`` checks: all of them, or that many drawn without replacement by
    ``seed`` (sorted, so a report lists them in order) -- one rule for every windowed folder kind."""
    if windows is None or windows >= total:
        return np.arange(total)
    return np.sort(np.random.default_rng(seed).choice(total, size=max(0, int(windows)), replace=False))


def _expect_fingerprint(directory, fingerprint: str, expected: str | None, whose: str) -> None:
    if expected is not None and fingerprint != expected:
        raise plan_error(errors.PLAN_FINGERPRINT_MISMATCH,
                         f"{directory}: the {whose} fingerprint is {fingerprint}, not the expected {expected}")


def _check_windows(plan, checks: list[str], windows: int | None, seed: int, check, what: str) -> dict:
    """Run ``check(plan, epoch, w)`` on the chosen windows of every epoch and report, for the folder kinds whose
    windows repeat per epoch (windowed plans, pretraining sequences)."""
    total = plan.definition.num_windows
    chosen = chosen_windows(total, windows, seed)
    for epoch in range(plan.num_epochs):
        for w in chosen.tolist():
            check(plan, epoch, w)
    checks.append(f"{chosen.shape[0]} of {total} {what}")
    return {"fingerprint": plan.fingerprint, "checks": checks, "windows_checked": int(chosen.shape[0])}
