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

chuk-lazarus is loaded as bench/bench_batching.py does (its top-level package
imports MLX); without it, its columns are empty. Sizes beyond ``--chuk-max``
are this package's alone::

    python bench/bench_packing.py                      # 2e3 .. 1e7
    python bench/bench_packing.py --sizes 8e3 --chuk-max 8e3
"""

from __future__ import annotations

import argparse
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
    header = (f"{'N':>10} {'mode':<9} | {'lengths/s':>11} {'python/s':>9} {'sequences/s':>11} | {'chuk/s':>7} "
              f"{'x seq':>6} {'x dec':>6} | {'rows':>9} {'bound':>9} {'over':>7} | same rows")
    print(header)
    print("-" * len(header))
    split = []  # (n, mode, chuk decision, chuk layout, our decision, our layout), seconds
    warm = lengths_of(200)
    for mode in MODES:  # imports and first calls, outside the timings
        pack_sequences(our_sequences(warm), MAX_LENGTH, mode)
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
            pack_sequences(ours, MAX_LENGTH, MODES[0])
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
                packed, packed_seconds = median_timed(repeats(n, 5), pack_sequences, ours, MAX_LENGTH, mode)
                assert len(packed) == count
                packed_rate = n / packed_seconds
                line += f"{packed_rate:>11,.0f} | "
            else:
                line += f"{'-':>11} | "
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
    args = parser.parse_args()
    start = time.perf_counter()
    run([int(float(x)) for x in args.sizes.split(",")], int(args.chuk_max), int(args.python_max), int(args.rows_max))
    print(f"({time.perf_counter() - start:.0f} s in all)")


if __name__ == "__main__":
    main()
