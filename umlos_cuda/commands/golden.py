"""``umlos-cuda golden verify``: recompute the packaged NextBatch_v2 golden traces.

Prints one line per case, ``PASS id`` or ``FAIL id``, then each failure's
differing fields and a summary. Exit status 0 only when every case passes, 1
when any fails (2, as for every command, on an ``UmlosError`` such as an
unavailable backend or an unreadable golden file). It never regenerates: that
is ``golden/make_nextbatch_golden.py``'s job.
"""

from __future__ import annotations

import sys

from ..backends import BACKEND_NAMES


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "golden",
        help="recompute the reference results shipped with umlos-cuda (golden traces) and compare",
        description="Work with the golden traces shipped in the package: stored indices and hashes of "
        "NextBatch_v2 calls over several seeds, world sizes and stages. 'golden verify' recomputes them.",
    )
    actions = parser.add_subparsers(dest="golden_action", metavar="ACTION")
    verify = actions.add_parser(
        "verify",
        help="recompute every golden case and compare (exit 0 only if all pass)",
        description="Recompute every golden case on a backend and compare it with the stored values. "
        "Prints PASS or FAIL per case; exit status 0 when all pass, 1 when one fails, 2 when the backend "
        "or the golden file cannot be used.",
    )
    verify.add_argument("--backend", default="auto", choices=BACKEND_NAMES, help="backend to check (default auto)")
    verify.add_argument("--file", metavar="F.json", help="a golden file to verify instead of the packaged one")
    verify.add_argument(
        "--only", metavar="TEXT", action="append",
        help="verify only cases whose id contains TEXT (repeatable), e.g. --only n1e6/s0",
    )
    verify.set_defaults(func=run_verify)
    parser.set_defaults(func=lambda args: (parser.print_help(), 1)[1])


def run_verify(args) -> int:
    from ._golden_vectors import verify

    def progress(done: int, total: int, case_id: str, passed: bool) -> None:
        print(f"{'PASS' if passed else 'FAIL'} {case_id}  [{done}/{total}]", flush=True)

    report = verify(path=args.file, backend=args.backend, progress=progress, only=args.only)
    for failure in report.failures:
        print(f"\n{failure.id} ({failure.kind}):")
        for line in failure.mismatches:
            print(f"  {line}")
    if not report.results:
        print("no golden case matched", file=sys.stderr)
        return 1
    print(("\n" if report.failures else "") + report.summary())
    return 0 if report.ok else 1
