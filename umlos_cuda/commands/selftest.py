"""``umlos-cuda selftest [--backend B]``: check that this machine computes the normative bits.

Runs, on the chosen backend (default ``auto``):

* ``philox-kat``: R1's three Philox4x32-10 known answers, on the backend's own
  Philox (the device for ``cupy``); a backend without a Philox entry point
  (``native``: its Philox is covered by ``parity``, through the plan tables it
  builds) is checked through the NumPy reference, and the line says so.
* ``r9-self-check``: R9's published ``sampler_config_hash``.
* ``parity``: a few million train positions over a few epochs and shapes (edge
  sizes, block sizes that are and are not powers of two, 128-bit products at
  N = 2^64 - 1) against the NumPy reference, bit for bit; with the NumPy
  backend itself there is nothing to compare and the line says SKIP.
* ``permutation``: every whole epoch computed above holds each index of [0, N)
  exactly once.
* ``exact``: sampled positions recomputed from the plan with Python integers
  (no 64-bit arithmetic at all), as R6 writes the formula.

Prints PASS / FAIL / SKIP per check and exits 0 only when none failed.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from dataclasses import dataclass

import numpy as np

from ..backends import BACKEND_NAMES, get_backend, to_numpy
from ..epoch import build_plan_reference, epoch_seed
from ..manifest.core import Manifest
from ..nextbatch import MODE_SHUFFLE, epoch_indices, sampler_config_hash
from ..philox import PHILOX_KATS, philox4x32_10
from ._progress import Progress

#: R9: the train ``sampler_config_hash`` for the default block size and drop_last = false.
R9_SELF_CHECK = "fd98df5908735429e5bc7ee2e4bffd7a4d91987c51c80697f112512562ecd90b"
DEFAULT_BLOCK_SIZE = 1 << 20

#: (N, sampler_block_size, epoch, windows): a window is (start, count); None is the whole epoch.
SWEEP = (
    (1, 1, 0, None),
    ((1 << 16) + 1, 1 << 8, 1, None),  # 2^k + 1: a tail block of one sample
    (100_003, 1000, 2, None),  # block size not a power of two
    (3 * (1 << 20) + 17, 1 << 20, 0, None),  # default block size, short tail
    (10**9, 1 << 20, 5, ((0, 1 << 20), (499_999_744, 1 << 19), (10**9 - (1 << 19), 1 << 19))),
    ((1 << 64) - 1, 1 << 63, 7, ((0, 4096), ((1 << 63) - 2048, 4096), ((1 << 64) - 4097, 4096))),
)
#: Positions recomputed with Python integers per sweep entry.
EXACT_SAMPLES = 500
PASS, FAIL, SKIP = "PASS", "FAIL", "SKIP"


@dataclass
class Result:
    name: str
    status: str
    detail: str


#: ``selftest --help``: the checks in a user's words (the module docstring cites the spec).
DESCRIPTION = """\
Check that this machine computes exactly the indices umlos-cuda promises, on
one backend (default auto). The checks:

  philox-kat     the random number generator (Philox4x32-10) reproduces its
                 published known answers
  r9-self-check  the sampler configuration hash equals its published value
  parity         a few million shuffled positions, over several epochs and
                 dataset sizes up to 2^64 - 1, are identical to the NumPy
                 reference (SKIP when the backend is numpy itself)
  permutation    every whole epoch computed holds each index exactly once
  exact          sampled positions equal the formula evaluated with Python
                 integers

Prints PASS, FAIL or SKIP per check. Exit status 0 when no check failed, 1
when one did, 2 when the backend cannot run here."""


def register(subparsers) -> None:
    selftest = subparsers.add_parser(
        "selftest",
        help="check this machine's results: known answers, parity with the NumPy reference; PASS/FAIL per check",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    selftest.add_argument("--backend", default="auto", choices=BACKEND_NAMES,
                          help="the backend to check: numpy, native, cupy or auto (default auto)")
    selftest.add_argument("--quiet", action="store_true", help="no progress line")
    selftest.set_defaults(func=run)


def _manifest(n: int, block_size: int) -> Manifest:
    return Manifest.from_dict(
        {
            "seed": 20240917,
            "global_batch_size": 1,
            "data": {"sampler_block_size": block_size},
            "datasets": {"selftest": {"id": "selftest", "version": 1, "hash": "none", "cardinality": n}},
        }
    )


def check_philox(engine) -> Result:
    rows = np.array([list(counter) + list(key) for counter, key, _ in PHILOX_KATS], dtype=np.uint32)
    device_philox = getattr(engine, "philox4x32_10", None)
    if device_philox is not None:
        got = [tuple(int(w) for w in row) for row in device_philox(rows)]
        where = f"on backend {engine.name}"
    else:
        got = [tuple(int(w) for w in philox4x32_10(row[0], row[1], row[2], row[3], int(row[4]),
                                                   int(row[5]))) for row in rows]
        where = "on the NumPy reference (umlos_cuda.philox)"
        if engine.name != "numpy":
            where += f"; backend {engine.name} has no Philox entry point, its Philox is checked by parity"
    want = [answer for _, _, answer in PHILOX_KATS]
    bad = [i for i, (g, w) in enumerate(zip(got, want)) if g != w]
    if bad:
        i = bad[0]
        return Result("philox-kat", FAIL, f"vector {i}: got {' '.join(f'{w:08x}' for w in got[i])}, "
                                          f"want {' '.join(f'{w:08x}' for w in want[i])}")
    return Result("philox-kat", PASS, f"R1's {len(want)} known answers {where}")


def check_r9() -> Result:
    got = sampler_config_hash(MODE_SHUFFLE, DEFAULT_BLOCK_SIZE, False).hex()
    status = PASS if got == R9_SELF_CHECK else FAIL
    return Result("r9-self-check", status,
                  f"sampler_config_hash {got}" + ("" if status == PASS else f", want {R9_SELF_CHECK}"))


def _exact_index(plan, position: int) -> int:
    """R6 with Python integers: base + (a * l + c) mod m for the position's block."""
    b, local = divmod(position, plan.block_size)
    return int(plan.base[b]) + (int(plan.a[b]) * local + int(plan.c[b])) % int(plan.m[b])


def sweep(engine, show_progress: bool) -> list[Result]:
    """``parity``, ``permutation`` and ``exact`` over SWEEP."""
    jobs = []
    for n, block_size, epoch, spans in SWEEP:
        for start, count in spans or ((0, n),):
            jobs.append((n, block_size, epoch, start, count, spans is None))
    total = sum(job[4] for job in jobs)
    progress = Progress(total, f"selftest parity [{engine.name}]", enabled=show_progress)
    compare = engine.name != "numpy"
    rng = random.Random(1)
    mismatches, not_permutations, inexact = [], [], []
    whole_epochs = exact_checked = done = 0
    started = time.perf_counter()
    for n, block_size, epoch, start, count, whole in jobs:
        manifest = _manifest(n, block_size)
        got = to_numpy(epoch_indices(manifest, "selftest", epoch=epoch, start=start, count=count, backend=engine.name))
        label = f"N={n} block={block_size} epoch={epoch} [{start}, {start + count})"
        if compare:
            want = epoch_indices(manifest, "selftest", epoch=epoch, start=start, count=count, backend="numpy")
            if not np.array_equal(got, want):
                first = int(np.flatnonzero(got != want)[0])
                mismatches.append(f"{label}: position {start + first} gave {int(got[first])}, numpy {int(want[first])}")
        if whole:
            whole_epochs += 1
            if not np.array_equal(np.sort(got), np.arange(n, dtype=np.uint64)):
                not_permutations.append(label)
        seed16 = epoch_seed(manifest.replay_token, manifest.hash, "selftest", epoch)
        plan = build_plan_reference(seed16, n, block_size)
        for offset in [0, count - 1] + [rng.randrange(count) for _ in range(EXACT_SAMPLES - 2)]:
            exact_checked += 1
            if int(got[offset]) != _exact_index(plan, start + offset):
                inexact.append(f"{label}: position {start + offset}")
                break
        done += count
        progress.update(done)
    progress.close()
    elapsed = time.perf_counter() - started
    results = []
    if not compare:
        results.append(Result("parity", SKIP, "backend numpy is the reference; nothing to compare against"))
    elif mismatches:
        results.append(Result("parity", FAIL,
                              f"{len(mismatches)} of {len(jobs)} windows differ; first: {mismatches[0]}"))
    else:
        results.append(Result("parity", PASS, f"{total:,} positions in {len(jobs)} windows of {len(SWEEP)} shapes "
                                              f"identical to numpy ({elapsed:.1f} s)"))
    if not_permutations:
        results.append(Result("permutation", FAIL, f"not a permutation of [0, N): {not_permutations[0]}"))
    else:
        results.append(Result("permutation", PASS, f"{whole_epochs} whole epochs each hold every index of [0, N) once"))
    if inexact:
        results.append(Result("exact", FAIL, f"differs from the Python-integer formula at {inexact[0]}"))
    else:
        results.append(Result("exact", PASS,
                              f"{exact_checked:,} sampled positions equal R6 computed with Python integers"))
    return results


def run_checks(backend: str = "auto", show_progress: bool = True) -> tuple[str, list[Result]]:
    """Resolve ``backend`` and run every check; raises UmlosError only when the backend is unusable."""
    engine = get_backend(backend)
    results = [check_philox(engine), check_r9()]
    results += sweep(engine, show_progress)
    return engine.name, results


def run(args) -> int:
    name, results = run_checks(args.backend, show_progress=not args.quiet)
    print(f"umlos-cuda selftest on backend {name}" + (f" (asked for {args.backend})" if args.backend != name else ""))
    width = max(len(r.name) for r in results)
    for result in results:
        print(f"{result.status}  {result.name:<{width}}  {result.detail}")
    failed = [r.name for r in results if r.status == FAIL]
    passed = sum(r.status == PASS for r in results)
    if failed:
        print(f"FAILED: {', '.join(failed)}", file=sys.stderr)
        return 1
    print(f"all checks passed ({passed} passed, {len(results) - passed} skipped)")
    return 0
