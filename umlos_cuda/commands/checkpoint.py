"""``umlos-cuda checkpoint inspect | verify | recover``.

``inspect PATH`` prints a readable summary of a container (header fields,
files with sizes and hashes, tensors, cursors, trace link, chain) or of a
store (its commits). ``verify PATH [--public-key K] [--expect-head H]
[--min-commit N]`` runs every check on a container or a whole store and exits
0 only if all pass; otherwise the failure code is on stderr (``error CODE:
message``, exit 2). Verifying a store prints its head hash: keep it outside
the store and pass it back with ``--expect-head`` to detect a rollback.
``recover STORE`` rolls back what an interrupted writer left, as the next
writer would.
``gc STORE --keep-last K`` keeps the newest K checkpoints of a store and
removes the older containers (certificates, lineage and tape stay).
docs/checkpoint-format.md describes the format and every code.
"""

from __future__ import annotations

import json

from ..checkpoint import summary
from ..checkpoint.commit import recover_store
from ._args import any_int


def register(subparsers) -> None:
    checkpoint = subparsers.add_parser(
        "checkpoint",
        help="inspect, verify, recover or garbage-collect checkpoint containers and stores",
        description=__doc__.split("\n\n")[1],
    )
    actions = checkpoint.add_subparsers(dest="checkpoint_command", metavar="ACTION")
    inspect = actions.add_parser("inspect", help="summarise a container or a store (reads the manifest only)")
    inspect.add_argument("path", help="a container folder or a store folder")
    inspect.add_argument("--json", action="store_true", help="print one JSON object")
    inspect.set_defaults(func=run_inspect)
    verify = actions.add_parser("verify", help="check every byte of a container or a store; exit 0 only if valid")
    verify.add_argument("path", help="a container folder or a store folder")
    verify.add_argument("--public-key", metavar="K",
                        help="trusted Ed25519 public key: 64 hex digits or a file (raw, hex or PEM)")
    verify.add_argument("--expect-head", metavar="HASH",
                        help="a store only: it must still hold the commit with this head hash (64 hex digits, "
                             "printed by verify and at commit time); CHECKPOINT_STALE otherwise")
    verify.add_argument("--min-commit", metavar="N", type=any_int("--min-commit"),
                        help="a store only: it must hold at least N commits; CHECKPOINT_STALE otherwise")
    verify.add_argument("--json", action="store_true", help="print one JSON object")
    verify.set_defaults(func=run_verify)
    recover = actions.add_parser("recover", help="roll back what an interrupted writer left in a store")
    recover.add_argument("path", help="a store folder")
    recover.set_defaults(func=run_recover)
    gc = actions.add_parser("gc", help="keep the newest K checkpoints of a store, remove the older containers")
    gc.add_argument("path", help="a store folder")
    gc.add_argument("--keep-last", metavar="K", type=any_int("--keep-last"), required=True,
                    help="how many of the newest checkpoints to keep (at least 1: the newest is always kept)")
    gc.add_argument("--lock-timeout", metavar="S", type=float, default=0.0,
                    help="seconds to wait while a writer holds the store (default 0: CHECKPOINT_LOCKED at once)")
    gc.set_defaults(func=run_gc)
    checkpoint.set_defaults(func=lambda args: (checkpoint.print_help(), 1)[1])


def run_inspect(args) -> int:
    result = summary.inspect_path(args.path)
    if args.json:
        print(json.dumps(result, indent=1, sort_keys=True))
        return 0
    if result["kind"] == "store":
        _print_store(result)
    else:
        _print_container(result)
    return 0


def _print_container(result: dict) -> None:
    header = result["header"]
    print(f"container        {result['path']}")
    print(f"checkpoint_hash  {result['checkpoint_hash']}")
    print(f"format           {result['format']} schema {header['checkpoint_schema_version']}")
    print(f"size             {result['total_bytes']:,} bytes in {len(result['entries']) + 1} files")
    print("header")
    width = max(len(k) for k in header)
    for name in sorted(header):
        value = header[name]
        print(f"  {name:<{width}}  {', '.join(value) if isinstance(value, list) else value}")
    print("files (path, bytes, sha256)")
    width = max(len(e["path"]) for e in result["entries"])
    for entry in result["entries"]:
        print(f"  {entry['path']:<{width}}  {entry['size']:>12,}  {entry['sha256']}")
    if result["tensors"]:
        print("tensors")
        for path, tensors in result["tensors"].items():
            if "error" in tensors:
                print(f"  {path}: {tensors['error']}")
                continue
            for name, info in tensors.items():
                print(f"  {path}: {name} {info['dtype']} {info['shape']}")
    print("cursors")
    for key, cursor in result["cursors"].items():
        print(f"  {key}: {cursor}")
    link = result["trace_link"]
    print("trace link")
    if "error" in link:
        print(f"  {link['error']}")
    else:
        print(f"  events {link['event_count']}, root {link['trace_root_hash']}, tail {link['trace_tail_hash']}, "
              f"{len(link['segments'])} segment(s)")
    print("chain")
    print(f"  checkpoint_hash_prev  {result['chain']['checkpoint_hash_prev'] or '(none: first checkpoint)'}")
    print(f"restore profiles  {', '.join(result['restore_profiles'])}")
    print("(inspect reads the manifest only; 'umlos-cuda checkpoint verify' checks every file)")


def _print_store(result: dict) -> None:
    print(f"store       {result['path']}")
    print(f"tenant/run  {result['tenant_id']} / {result['run_id']}")
    print(f"public key  {result['public_key']}")
    print(f"commits     {len(result['commits'])}")
    if result["collected_through"]:
        print(f"retention   checkpoints of commits 1..{result['collected_through']} collected "
              "(their certificates and hashes are kept)")
    for commit in result["commits"]:
        what = f"{commit['checkpoint']} {commit['checkpoint_hash']}" if commit["checkpoint"] else "(trace only)"
        if commit["collected"]:
            what += " (collected)"
        print(f"  {commit['seq']:>4}  t={commit['t']:<8} events={commit['trace_events']:<8} {what}")
    print("(inspect checks certificates and signatures; 'umlos-cuda checkpoint verify' checks every file)")


def run_verify(args) -> int:
    result = summary.verify_path(args.path, args.public_key, expect_head=args.expect_head, min_commit=args.min_commit)
    if args.json:
        print(json.dumps(result, indent=1, sort_keys=True))
        return 0
    if result["kind"] == "store":
        collected = f" ({result['checkpoints_collected']} collected)" if result.get("checkpoints_collected") else ""
        print(f"OK store {result['store']}: {result['commits']} commits, "
              f"{result['checkpoints']} checkpoints{collected}, "
              f"{result['trace_events']} trace events in {result['trace_segments']} segments")
        print(f"   latest checkpoint {result['latest_checkpoint']} ({result['latest_checkpoint_hash']})")
        if result["head"]:
            print(f"   head (commit {result['commits']}) {result['head']}: keep it elsewhere; "
                  "--expect-head refuses a store rolled back past it")
        if result["writer_active"]:
            print("   a writer holds the store: the committed state was checked, not its in-flight objects")
        trust = ("trusted key" if result["key_trusted"]
                 else "the store's own key (pass --public-key to check who signed)")
        print(f"   certificates signed by {result['public_key']}, checked against {trust}")
    else:
        print(f"OK container {result['path']}: {result['files']} files, schema {result['schema_version']}, "
              f"t={result['t']}")
        print(f"   checkpoint_hash {result['checkpoint_hash']}")
        certificate = result["certificate"]
        if certificate:
            trust = "trusted key" if certificate["key_trusted"] else "the store's own key"
            print(f"   certified by commit {certificate['commit']}, signed by {certificate['public_key']} ({trust})")
        else:
            print("   not inside a store: no commit certificate to check")
    return 0


def run_recover(args) -> int:
    report = recover_store(args.path)
    print(f"store {args.path}: committed through commit {report.committed_seq}")
    for path in report.rolled_back:
        print(f"  rolled back {path}")
    for path in report.unknown:
        print(f"  left alone (not a store object) {path}")
    if not report.rolled_back:
        print("  nothing to roll back")
    return 0


def run_gc(args) -> int:
    from ..checkpoint.retention import collect_garbage

    report = collect_garbage(args.path, args.keep_last, lock_timeout=args.lock_timeout)
    kept = ", ".join(str(seq) for seq in report.kept) or "none"
    collected = f"commits 1..{report.collected_through} collected" if report.collected_through else "none collected"
    print(f"store {args.path}: keeping the checkpoints of commits {kept}; {collected}")
    for path in report.removed:
        print(f"  removed {path}")
    if not report.removed:
        print("  nothing to remove")
    return 0
