"""Sequence packing: umlos_cuda.batching beside chuk-lazarus 0.4.1's ``pack_sequences``.

The same lognormal lengths as bench/bench_batching.py (median 245, sigma 1),
clipped to the row length 2048 so that every sequence fits a row (chuk-lazarus
drops longer ones silently; this package would refuse them), are
packed by first-fit, best-fit and greedy. Columns:

* ``lengths/s``: sequences per second of ``pack_lengths`` (the rows from the
  lengths; backend native, the C++ extension) and ``python/s`` of its Python
  fallback (``backend="python"``, what runs without a compiler);
* ``sequences/s``: ``pack_sequences`` on token sequences, rows laid out
  (input_ids, loss_mask, segment_ids, position_ids, cu_seqlens), which is
  what chuk-lazarus's ``pack_sequences`` does (its ``chuk/s``; it builds
  pydantic rows padded to 2048, its default). Each library gets its own
  validated input objects, built before the clock starts: ours
  ``SequenceToPack`` (int32 NumPy arrays), theirs its pydantic
  ``SequenceToPack`` (tuples of ints, as its model holds them); every timing
  follows a garbage collection, each mode has a warm-up call at 200
  sequences, and each size one of ``pack_sequences`` (and of chuk-lazarus up
  to 10^4 sequences). ``sequences/s`` is the median of 5 runs up to 10^5 sequences,
  ``chuk/s`` of 3 runs up to 10^4 (a run takes seconds there; above, one
  run); ``lengths/s`` and ``python/s`` are one run. ``x seq`` is the ratio
  of the two whole calls; ``x dec`` that of the packing decisions alone:
  ``pack_lengths`` against chuk-lazarus's call less the time spent in its
  ``PackingBin.to_packed_sequence`` (its row layout, timed by wrapping that
  method; what is left is its bin scan, the part that is quadratic);
* ``rows`` against the lower bound ``ceil(sum of lengths / 2048)``, and
  whether chuk-lazarus's rows hold the same sequences, row by row (they
  should: both follow the same definitions; greedy lists a row's sequences
  in input order here, longest first there).

``sequences/s`` is measured up to ``--rows-max`` sequences (its arrays hold
every token: about 400 per sequence here).

A second table splits each library's call where both ran: milliseconds of
the packing decision and of the row layout (``pack_sequences`` less
``pack_lengths`` here; ``to_packed_sequence`` there), each pair's ratio.
The layout's output is fixed by what the rows hold (here four int32 arrays
per token, written into memory the process has not touched before), so its
ratio says how much of the whole call's ratio is left to gain.

chuk-lazarus returns rows laid out, so beside it ``sequences/s`` times
``pack_sequences(...).materialize()`` (every row laid out, what the call did
before its result became lazy); ``lazy/s`` is the call alone.

chuk-lazarus is loaded as bench/bench_batching.py does (its top-level package
imports MLX); without it, its columns are empty. Sizes beyond ``--chuk-max``
are this package's alone.

A third table (``--trl-sizes``, default 10^6) sets ``pack_sequences`` beside
TRL's ``pack_dataset(strategy="bfd")`` on the same lengths and tokens: TRL
gets a ``datasets.Dataset`` of one Arrow ``list<int32>`` column, this package
its ``SequenceToPack`` objects, both built before the clock starts. Rounds
of TRL's call then each mode's (the median of ``--trl-runs`` rounds) meet
the same load of a shared machine. Each call's peak is the resident memory
it added at its highest (Linux's peak reset before the call). TRL's
``pack_dataset`` packs each ``datasets.map`` batch (1000 examples by default)
on its own; ``--trl-one-batch`` also times it with the whole dataset as one
batch (one best-fit-decreasing over all, the scope of this package's
decision). Then, per mode, every row is laid out a microbatch of 8 rows at
a time (a 16,384-token budget), and all at once (``materialize()``).

A fourth table (``--e2e-sizes``, default 10^6) is end to end without an
object per sequence: ``pack_token_arrays`` on flat arrays and
``pack_token_source`` on a token store written to disk, beside TRL from a
``Dataset`` in memory, from ``save_to_disk``'s files, and built inside the
clock (:func:`run_end_to_end` says what each clock includes)::

    python bench/bench_packing.py                      # 2e3 .. 1e7, then TRL at 1e6, then end to end
    python bench/bench_packing.py --sizes 8e3 --chuk-max 8e3 --trl-sizes "" --e2e-sizes ""
    python bench/bench_packing.py --sizes "" --trl-sizes 1e6 --trl-one-batch --e2e-sizes ""
    python bench/bench_packing.py --sizes "" --trl-sizes "" --e2e-sizes 1e6
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from functools import partial
from unittest import mock

import numpy as np

from bench_batching import load_chuk, lognormal_lengths, timed
from umlos_cuda.batching import SequenceToPack, pack_lengths, pack_sequences
from umlos_cuda.batching.packing.pack import native_module

MAX_LENGTH = 2048
MODES = ("first_fit", "best_fit", "greedy")


def lengths_of(n: int) -> np.ndarray:
    return np.minimum(lognormal_lengths(n), MAX_LENGTH)


def our_sequences(lengths: np.ndarray) -> list[SequenceToPack]:
    """Token sequences of the given lengths (token i of any sequence is i % 1000)."""
    tokens = np.arange(int(lengths.max()), dtype=np.int32) % 1000
    return [SequenceToPack(str(i), tokens[:length]) for i, length in enumerate(lengths.tolist())]


def laid_out(sequences, max_length: int, mode: str) -> list:
    """``pack_sequences`` with every row laid out (``materialize()``): what
    chuk-lazarus's ``pack_sequences`` returns, and what this package's
    returned before its result became lazy."""
    return pack_sequences(sequences, max_length, mode).materialize()


def chuk_pack(batching, sequences, mode):
    config = batching.PackingConfig(mode=batching.PackingMode(mode), max_length=MAX_LENGTH)
    return batching.pack_sequences(sequences, config)


def chuk_timed(batching, sequences, mode, runs: int):
    """chuk-lazarus's rows and the median seconds of its whole call
    (:func:`median_timed`) and of the part spent laying out rows
    (``PackingBin.to_packed_sequence``, wrapped for the calls)."""
    original = batching.planning.packing.PackingBin.to_packed_sequence
    layouts = []

    def layout(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return original(self, *args, **kwargs)
        finally:
            layouts[-1] += time.perf_counter() - start

    def call():
        layouts.append(0.0)
        return chuk_pack(batching, sequences, mode)

    with mock.patch.object(batching.planning.packing.PackingBin, "to_packed_sequence", layout):
        rows, seconds = median_timed(runs, call)
    return rows, seconds, float(np.median(layouts))


def repeats(n: int, most: int) -> int:
    """Timed runs of a call on ``n`` sequences: ``most`` up to 10^5 sequences,
    one above. The first call at a new size pays one-off costs of the process
    (the kernel handing it hundreds of MB it never had: one run up to 4x the
    next), and single runs of a few milliseconds vary by 2x with the
    allocator's state; the median of several runs is the steady rate."""
    return most if n <= 100_000 else 1


def median_timed(runs: int, function, *args):
    """The result of the last of ``runs`` timed calls (each after a garbage
    collection, the previous result freed first) and their median seconds."""
    seconds = []
    result = None
    for _ in range(runs):
        result = None
        result, elapsed = timed(function, *args)
        seconds.append(elapsed)
    return result, float(np.median(seconds))


def rate(n: int, seconds: float) -> str:
    return f"{n / seconds:,.0f}"


def run(sizes: list[int], chuk_max: int, python_max: int, rows_max: int) -> None:
    batching = load_chuk()
    if batching is None:
        print("chuk-lazarus is not installed: its columns are empty "
              "(pip install --no-deps chuk-lazarus==0.4.1 pydantic aiofiles)")
    if native_module() is None:
        print("umlos_cuda._packing is not built: lengths/s is the Python fallback")
    print(f"lognormal lengths (median 245, sigma 1) clipped to {MAX_LENGTH}; rows of {MAX_LENGTH} tokens")
    header = (f"{'N':>10} {'mode':<9} | {'lengths/s':>11} {'python/s':>9} {'sequences/s':>11} {'lazy/s':>11} | "
              f"{'chuk/s':>7} "
              f"{'x seq':>6} {'x dec':>6} | {'rows':>9} {'bound':>9} {'over':>7} | same rows")
    print(header)
    print("-" * len(header))
    split = []  # (n, mode, chuk decision, chuk layout, our decision, our layout), seconds
    warm = lengths_of(200)
    for mode in MODES:  # imports and first calls, outside the timings
        laid_out(our_sequences(warm), MAX_LENGTH, mode)
        if batching is not None:
            chuk_pack(batching, [batching.SequenceToPack(sample_id=str(i), input_ids=tuple(range(x)),
                                                         loss_mask=(1,) * x) for i, x in enumerate(warm.tolist())],
                                                         mode)
    for n in sizes:
        lengths = lengths_of(n)
        bound = -(-int(lengths.sum(dtype=np.int64)) // MAX_LENGTH)
        with_rows = n <= rows_max
        ours = our_sequences(lengths) if with_rows else None
        theirs = None
        if batching is not None and n <= chuk_max:
            tokens = tuple(range(int(lengths.max())))
            theirs = [batching.SequenceToPack(sample_id=str(i), input_ids=tokens[:length], loss_mask=(1,) * length)
                      for i, length in enumerate(lengths.tolist())]
        if with_rows:  # the first call at a size pays one-off costs of the process (see repeats)
            laid_out(ours, MAX_LENGTH, MODES[0])
            if theirs is not None and n <= 10_000:
                chuk_pack(batching, theirs, MODES[0])
        for mode in MODES:
            rows, seconds = timed(pack_lengths, lengths, MAX_LENGTH, mode)
            count = int(rows.max()) + 1
            python = "-"
            if n <= python_max:
                again, python_seconds = timed(partial(pack_lengths, lengths, MAX_LENGTH, mode, backend="python"))
                assert np.array_equal(again, rows)
                python = rate(n, python_seconds)
            line = f"{n:>10,} {mode:<9} | {rate(n, seconds):>11} {python:>9} "
            packed_rate, packed = None, None
            if with_rows:
                packed, packed_seconds = median_timed(repeats(n, 5), laid_out, ours, MAX_LENGTH, mode)
                assert len(packed) == count
                packed_rate = n / packed_seconds
                _, lazy_seconds = median_timed(repeats(n, 5), pack_sequences, ours, MAX_LENGTH, mode)
                line += f"{packed_rate:>11,.0f} {rate(n, lazy_seconds):>11} | "
            else:
                line += f"{'-':>11} {'-':>11} | "
            same = "-"
            if theirs is not None:
                chuk_rows, chuk_seconds, chuk_layout = chuk_timed(batching, theirs, mode, 3 if n <= 10_000 else 1)
                whole = "-"
                if packed is not None:  # sizes above --rows-max have no rows of ours to compare
                    same = "yes" if [sorted(r.sample_ids) for r in chuk_rows] == \
                        [sorted(r.sample_ids) for r in packed] else "NO"
                    whole = f"{packed_rate * chuk_seconds / n:.0f}x"
                    split.append((n, mode, chuk_seconds - chuk_layout, chuk_layout, seconds, packed_seconds - seconds))
                line += f"{rate(n, chuk_seconds):>7} {whole:>6} {(chuk_seconds - chuk_layout) / seconds:>5.0f}x | "
                del chuk_rows
            else:
                line += f"{'-':>7} {'-':>6} {'-':>6} | "
            line += f"{count:>9,} {bound:>9,} {100 * (count / bound - 1):>6.2f}% | {same}"
            print(line, flush=True)
            packed = None  # free this mode's rows before the next mode is timed
    if split:
        print_split(split)


# ====================================================================== beside TRL's pack_dataset
ROWS_PER_MICROBATCH = 8  # a token budget of 16,384 in rows of 2048: a packed plan's microbatch


def load_trl():
    """``(trl.pack_dataset, datasets)``, or None when TRL is not installed."""
    try:
        import datasets
        from trl import pack_dataset
    except ImportError:
        return None
    datasets.disable_progress_bars()
    return pack_dataset, datasets


def flat_arrays(lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(tokens, offsets)``: the tokens of :func:`our_sequences` (token i of
    any sequence is i % 1000) as one int32 array, and where each sequence starts."""
    offsets = np.zeros(lengths.shape[0] + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    values = ((np.arange(int(offsets[-1]), dtype=np.int64) - np.repeat(offsets[:-1], lengths)) % 1000)
    return values.astype(np.int32), offsets


def trl_dataset(datasets, lengths: np.ndarray, flat: tuple[np.ndarray, np.ndarray] | None = None):
    """A ``datasets.Dataset`` of one ``input_ids`` column (Arrow ``list<int32>``)
    holding the same tokens as :func:`our_sequences` (token i of any sequence
    is i % 1000), built from flat arrays (:func:`flat_arrays`, or ``flat``
    when given) with no per-sequence Python object."""
    import pyarrow as pa
    from datasets.table import InMemoryTable

    values, offsets = flat_arrays(lengths) if flat is None else flat
    kind = pa.ListArray if offsets[-1] < 2**31 else pa.LargeListArray  # int32 offsets, as datasets writes them
    column = kind.from_arrays(pa.array(offsets.astype(np.int32) if kind is pa.ListArray else offsets),
                              pa.array(values, type=pa.int32()))
    return datasets.Dataset(InMemoryTable(pa.table({"input_ids": column})))


def _status(field: str) -> int | None:
    """A ``/proc/self/status`` field in bytes (Linux), else None."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def measured(function, *args):
    """``function(*args)``, its seconds and the peak resident memory it added
    (bytes; None where Linux's peak cannot be reset). After a garbage
    collection, the process's peak (VmHWM) is reset to its current resident
    size (``/proc/self/clear_refs``), so the peak read afterwards, less the
    size before, is what the call took at its highest: Arrow's, NumPy's and
    Python's memory alike (tracemalloc sees no Arrow buffer)."""
    gc.collect()
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as clear:
            clear.write("5")
        before = _status("VmRSS")
    except OSError:
        before = None
    start = time.perf_counter()
    result = function(*args)
    seconds = time.perf_counter() - start
    peak = _status("VmHWM")
    return result, seconds, None if before is None or peak is None else max(peak - before, 0)


def megabytes(size: int | None) -> str:
    return "-" if size is None else f"{size / 2**20:,.0f}"


def summary(timings: list) -> tuple[float, int | None]:
    """The median seconds and the largest peak of ``(seconds, peak)`` pairs."""
    peaks = [peak for _, peak in timings]
    return float(np.median([seconds for seconds, _ in timings])), None if None in peaks else max(peaks)


def each_microbatch(packed, rows_per_microbatch: int) -> int:
    """Lay out every row, one microbatch at a time, keeping none: rows laid out."""
    rows = 0
    for batch in packed.microbatches(rows_per_microbatch):
        rows += len(batch)
    return rows


def run_trl(sizes: list[int], runs: int, eager_max: int, whole_batch: bool) -> None:
    """``pack_sequences`` beside TRL's ``pack_dataset(strategy="bfd")`` on the same lengths."""
    loaded = load_trl()
    if loaded is None:
        print("TRL is not installed (pip install trl datasets): no comparison with pack_dataset")
        return
    pack_dataset, datasets = loaded
    print()
    print(f"beside TRL's pack_dataset(strategy='bfd'); rows of {MAX_LENGTH} tokens; seconds are the median of "
          f"{runs} rounds (TRL, then each mode; the rest: one run); peak MB is the resident memory a call added "
          "at its highest; x TRL is TRL's median seconds over the line's")
    header = (f"{'N':>10} {'what':<44} | {'seconds':>8} {'peak MB':>8} | {'rows':>9} {'bound':>9} | "
              f"{'x TRL':>7}")
    print(header)
    print("-" * len(header))
    warm = lengths_of(200)
    pack_dataset(trl_dataset(datasets, warm), MAX_LENGTH, strategy="bfd")
    pack_sequences(our_sequences(warm), MAX_LENGTH).materialize()

    def line(n, what, seconds, peak, rows, bound, trl_seconds):
        ratio = f"{trl_seconds / seconds:.1f}x" if trl_seconds else "-"
        print(f"{n:>10,} {what:<44} | {seconds:>8.3f} {megabytes(peak):>8} | {rows:>9,} {bound:>9,} | "
              f"{ratio:>7}", flush=True)

    for n in sizes:
        lengths = lengths_of(n)
        bound = -(-int(lengths.sum(dtype=np.int64)) // MAX_LENGTH)
        dataset, ours = trl_dataset(datasets, lengths), our_sequences(lengths)
        # Rounds: TRL, then each mode of ours, so that both meet the same load of a shared machine.
        timings: dict[str, list] = {}
        row_counts: dict[str, int] = {}
        for _ in range(runs):
            for what, call in [("trl", partial(pack_dataset, dataset, MAX_LENGTH, "bfd"))] + \
                    [(mode, partial(pack_sequences, ours, MAX_LENGTH, mode)) for mode in MODES]:
                result, seconds, peak = measured(call)
                timings.setdefault(what, []).append((seconds, peak))
                row_counts[what] = len(result)
                result = None

        trl_seconds, peak = summary(timings["trl"])
        line(n, "TRL bfd (map batches of 1000)", trl_seconds, peak, row_counts["trl"], bound, None)
        if whole_batch:
            packed, seconds, peak = measured(partial(pack_dataset, dataset, MAX_LENGTH, "bfd",
                                                     map_kwargs={"batch_size": None}))
            line(n, "TRL bfd (one batch of all)", seconds, peak, len(packed), bound, None)
            packed = None
        dataset = None
        for mode in MODES:
            seconds, peak = summary(timings[mode])
            line(n, f"pack_sequences {mode} (lazy)", seconds, peak, row_counts[mode], bound, trl_seconds)
        print(f"{'':>10}   (seconds of each round: "
              f"{'; '.join(k + ' ' + ', '.join(f'{t:.3f}' for t, _ in ts) for k, ts in timings.items())})")
        for mode in MODES:
            packed = pack_sequences(ours, MAX_LENGTH, mode)
            laid, seconds, peak = measured(each_microbatch, packed, ROWS_PER_MICROBATCH)
            microbatches = -(-len(packed) // ROWS_PER_MICROBATCH)
            line(n, f"{mode}: every microbatch of {ROWS_PER_MICROBATCH} rows", seconds, peak, laid, bound, None)
            print(f"{'':>10}   ({seconds / microbatches * 1e6:,.0f} us per microbatch of "
                  f"{ROWS_PER_MICROBATCH} rows, {microbatches:,} microbatches, laid out one after the other)")
            packed = None
            if n <= eager_max:
                laid_rows, seconds, peak = measured(laid_out, ours, MAX_LENGTH, mode)
                line(n, f"{mode}: all rows at once (materialize)", seconds, peak, len(laid_rows), bound, trl_seconds)
                laid_rows = None
        ours = None

# ====================================================================== end to end, no object per sequence
def run_end_to_end(sizes: list[int], runs: int, folder: str | None) -> None:
    """From data to the lazy view, beside TRL from data to its packed dataset.

    Three clocks, each stated in the table's title lines:

    * A, inputs in memory, built before both clocks: TRL's
      ``pack_dataset`` on a ``datasets.Dataset`` (Arrow, built from flat
      arrays); ``pack_token_arrays`` on the flat arrays themselves.
    * B, from files on disk (written before, read through a warm page
      cache), opening inside both clocks: ``datasets.load_from_disk`` of
      ``save_to_disk``'s folder then ``pack_dataset`` (with datasets'
      caching off, so no round reuses an earlier round's map); a token store
      (ids in its length cache, as ``data tokenize`` writes it) opened by
      ``TokenStore.open`` then ``pack_token_source``.
    * C, from flat NumPy arrays in memory, construction inside both clocks:
      TRL's ``Dataset`` built from them (Arrow arrays over the same memory,
      the cheapest construction there is; from Python token lists it costs
      far more) then ``pack_dataset``; this package's ``SequenceToPack``
      objects made from them then ``pack_sequences`` (the object input);
      ``pack_token_arrays`` needs no construction (clock A's line).

    Then every row of the flat, the store and the object views laid out a
    microbatch of 8 rows at a time, and the store's first microbatch alone
    (it reads the ids of the length cache once).
    """
    import shutil
    import tempfile

    sys_path = os.path.dirname(os.path.abspath(__file__))
    if sys_path not in sys.path:
        sys.path.insert(0, sys_path)
    from bench_sharded_store import write_store
    from umlos_cuda.batching import pack_token_arrays, pack_token_source
    from umlos_cuda.batching.tokens.store import TokenStore

    loaded = load_trl()
    if loaded is None:
        print("TRL is not installed (pip install trl datasets): no end-to-end comparison")
        return
    pack_dataset, datasets = loaded
    datasets.disable_caching()
    root = tempfile.mkdtemp(prefix="bench-packing-", dir=folder)
    try:
        for n in sizes:
            end_to_end(n, runs, root, pack_dataset, datasets, write_store, pack_token_arrays, pack_token_source,
                       TokenStore)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def end_to_end(n, runs, root, pack_dataset, datasets, write_store, pack_token_arrays, pack_token_source,
               token_store) -> None:
    lengths = lengths_of(n)
    bound = -(-int(lengths.sum(dtype=np.int64)) // MAX_LENGTH)
    flat = flat_arrays(lengths)
    tokens, offsets = flat
    store_dir, arrow_dir = os.path.join(root, f"store-{n}"), os.path.join(root, f"arrow-{n}")
    write_store(store_dir, tokens.astype(np.uint16), lengths, 0)
    dataset = trl_dataset(datasets, lengths, flat)
    dataset.save_to_disk(arrow_dir)
    warm = lengths_of(200)
    pack_dataset(trl_dataset(datasets, warm), MAX_LENGTH, strategy="bfd")
    pack_token_arrays(*flat_arrays(warm), max_length=MAX_LENGTH).materialize()
    for name in ("tokens", "loss_mask", "offsets"):  # the page cache holds both sides' files, as after a first read
        np.load(os.path.join(store_dir, f"{name}.npy"), mmap_mode="r").sum()
    pack_dataset(datasets.load_from_disk(arrow_dir), MAX_LENGTH, strategy="bfd")

    def from_disk_trl():
        return pack_dataset(datasets.load_from_disk(arrow_dir), MAX_LENGTH, strategy="bfd")

    def from_disk_ours(mode):
        return pack_token_source(token_store.open(store_dir), max_length=MAX_LENGTH, mode=mode)

    def built_trl():
        return pack_dataset(trl_dataset(datasets, lengths, flat), MAX_LENGTH, strategy="bfd")

    def built_objects():
        return pack_sequences(our_sequences(lengths), MAX_LENGTH, "first_fit")

    calls = [("A trl", partial(pack_dataset, dataset, MAX_LENGTH, "bfd"))]
    calls += [(f"A {mode}", partial(pack_token_arrays, tokens, offsets, max_length=MAX_LENGTH, mode=mode))
              for mode in MODES]
    calls += [("B trl", from_disk_trl)] + [(f"B {mode}", partial(from_disk_ours, mode)) for mode in MODES]
    calls += [("C trl", built_trl), ("C objects", built_objects)]
    timings: dict[str, list] = {}
    row_counts: dict[str, int] = {}
    for _ in range(runs):  # rounds: every call once per round, so all meet the same load of a shared machine
        for what, call in calls:
            result, seconds, peak = measured(call)
            timings.setdefault(what, []).append((seconds, peak))
            row_counts[what] = len(result)
            result = None
    print()
    print(f"end to end at {n:,} sequences ({int(offsets[-1]):,} tokens), rows of {MAX_LENGTH}: seconds are the "
          f"median of {runs} rounds; peak MB as above; x TRL is TRL's median seconds (same clock) over the line's")
    header = (f"{'N':>10} {'what':<58} | {'seconds':>8} {'peak MB':>8} | {'rows':>9} {'bound':>9} | {'x TRL':>7}")
    print(header)
    print("-" * len(header))

    def line(what, key, trl_key=None):
        seconds, peak = summary(timings[key])
        ratio = "-" if trl_key is None else f"{summary(timings[trl_key])[0] / seconds:.1f}x"
        print(f"{n:>10,} {what:<58} | {seconds:>8.3f} {megabytes(peak):>8} | {row_counts[key]:>9,} {bound:>9,} | "
              f"{ratio:>7}", flush=True)

    print("A: inputs in memory, built before both clocks")
    line("TRL pack_dataset(Dataset in memory, 'bfd')", "A trl")
    for mode in MODES:
        line(f"pack_token_arrays(tokens, offsets) {mode}", f"A {mode}", "A trl")
    print("B: from files on disk (page cache warm), opening inside both clocks")
    line("TRL load_from_disk + pack_dataset('bfd')", "B trl")
    for mode in MODES:
        line(f"TokenStore.open + pack_token_source {mode}", f"B {mode}", "B trl")
    print("C: from flat NumPy arrays in memory, construction inside both clocks")
    line("TRL Dataset from the arrays + pack_dataset('bfd')", "C trl")
    line("SequenceToPack objects + pack_sequences first_fit", "C objects", "C trl")
    line("pack_token_arrays first_fit (nothing to construct)", "A first_fit", "C trl")
    print(f"{'':>10}   (seconds of each round: "
          f"{'; '.join(k + ' ' + ', '.join(f'{t:.3f}' for t, _ in ts) for k, ts in timings.items())})")
    dataset = None
    for what, make in (("flat arrays", partial(pack_token_arrays, tokens, offsets, max_length=MAX_LENGTH)),
                       ("token store", partial(from_disk_ours, "first_fit")),
                       ("SequenceToPack objects", built_objects)):
        packed = make()
        if what == "token store":
            _, first, _ = measured(packed.rows, 0, ROWS_PER_MICROBATCH)
            print(f"{'':>10}   token store: first microbatch {first * 1e3:,.1f} ms (reads the store's ids once)")
        laid, seconds, peak = measured(each_microbatch, packed, ROWS_PER_MICROBATCH)
        microbatches = -(-len(packed) // ROWS_PER_MICROBATCH)
        print(f"{n:>10,} {what + ': every microbatch of 8 rows, first_fit':<58} | {seconds:>8.3f} "
              f"{megabytes(peak):>8} | {laid:>9,} {bound:>9,} | {'-':>7}")
        print(f"{'':>10}   ({seconds / microbatches * 1e6:,.0f} us per microbatch of {ROWS_PER_MICROBATCH} rows, "
              f"{microbatches:,} microbatches, laid out one after the other)", flush=True)
        packed = None


def print_split(split) -> None:
    """Milliseconds of each library's packing decision and row layout, and their ratios."""
    print()
    header = (f"{'N':>10} {'mode':<9} | {'chuk decide':>11} {'chuk layout':>11} | {'decide':>8} {'layout':>8} | "
              f"{'x decide':>8} {'x layout':>8}")
    print(header)
    print("-" * len(header))
    for n, mode, chuk_decide, chuk_layout, decide, layout in split:
        print(f"{n:>10,} {mode:<9} | {chuk_decide * 1e3:>11.1f} {chuk_layout * 1e3:>11.1f} | "
              f"{decide * 1e3:>8.2f} {layout * 1e3:>8.2f} | "
              f"{chuk_decide / decide:>7.0f}x {chuk_layout / layout:>7.1f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="2e3,8e3,3.2e4,1e5,1e6,1e7", help="comma-separated N")
    parser.add_argument("--chuk-max", type=float, default=3.2e4, help="largest N packed by chuk-lazarus too")
    parser.add_argument("--python-max", type=float, default=1e6, help="largest N packed by the Python fallback too")
    parser.add_argument("--rows-max", type=float, default=1e5, help="largest N laid out by pack_sequences")
    parser.add_argument("--trl-sizes", default="1e6", help="comma-separated N packed beside TRL's pack_dataset "
                        "(empty: none)")
    parser.add_argument("--trl-runs", type=int, default=3, help="timed runs of each call beside TRL")
    parser.add_argument("--eager-max", type=float, default=1e6,
                        help="largest N beside TRL whose rows are also laid out all at once (6 GB at 10^6)")
    parser.add_argument("--trl-one-batch", action="store_true",
                        help="also time TRL with the whole dataset as one map batch (one BFD over all)")
    parser.add_argument("--e2e-sizes", default="1e6", help="comma-separated N packed end to end beside TRL: from "
                        "arrays in memory, from files on disk, with construction (empty: none)")
    parser.add_argument("--e2e-runs", type=int, default=3, help="timed rounds of the end-to-end calls")
    parser.add_argument("--e2e-folder", default=None, help="where the end-to-end files are written (a temporary "
                        "folder inside it, removed at the end; default: the system's)")
    args = parser.parse_args()
    start = time.perf_counter()
    sizes = [int(float(x)) for x in args.sizes.split(",") if x]
    if sizes:
        run(sizes, int(args.chuk_max), int(args.python_max), int(args.rows_max))
    trl_sizes = [int(float(x)) for x in args.trl_sizes.split(",") if x]
    if trl_sizes:
        run_trl(trl_sizes, args.trl_runs, int(args.eager_max), args.trl_one_batch)
    e2e_sizes = [int(float(x)) for x in args.e2e_sizes.split(",") if x]
    if e2e_sizes:
        run_end_to_end(e2e_sizes, args.e2e_runs, args.e2e_folder)
    print(f"({time.perf_counter() - start:.0f} s in all)")


if __name__ == "__main__":
    main()
