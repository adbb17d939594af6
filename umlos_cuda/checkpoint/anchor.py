"""Anchors against rollback: what a caller kept about a store, outside it.

Every certificate of a store chains the one before it, so a store proves that
what it holds is a consistent prefix of its run. It cannot prove that it holds
*all* of the run: delete every object of the newest commits and what remains
is a shorter chain, just as consistent, which verifies; a restore then returns
an older checkpoint without a word. Only something kept elsewhere tells the
two apart (docs/checkpoint-format.md §9.6):

- the *head hash* of a commit, ``CommitRecord.head``: the SHA-256 of its
  certificate (hex), printed by the demo and by ``checkpoint verify``. The
  store must still hold that certificate; since each certificate hashes the
  previous one, this also pins every commit before it, so a store rewritten
  (even re-signed by the key holder) from that point back is refused too;
- a commit number: the store must hold at least that many commits.

A store behind its anchor is refused with ``CHECKPOINT_STALE``.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

from .. import checks, errors
from .codes import error


def parse_head(value: Any) -> bytes:
    """A head hash given as 64 hex digits or 32 bytes; ``CHECKPOINT_STATE_INVALID`` otherwise."""
    if isinstance(value, (bytes, bytearray)) and len(value) == 32:
        return bytes(value)
    if isinstance(value, str) and len(value) == 64:
        try:
            return bytes.fromhex(value)
        except ValueError:
            pass
    raise error(errors.CHECKPOINT_STATE_INVALID,
                f"expect_head must be a commit's head hash: 64 hex digits or 32 bytes, got {value!r}")


def parse_min_commit(value: Any) -> int:
    return checks.integer(value, "min_commit", 0, None, fail=partial(error, errors.CHECKPOINT_STATE_INVALID),
                          message=checks.AT_LEAST)


def check_anchor(commits: Sequence[Any], *, expect_head: Any = None, min_commit: Any = None) -> None:
    """Refuse a store whose certificates (``CommitRecord`` list, 1..M) are
    behind the anchor: fewer than ``min_commit`` commits, or no certificate
    whose hash is ``expect_head``."""
    if min_commit is not None:
        wanted = parse_min_commit(min_commit)
        if len(commits) < wanted:
            raise error(errors.CHECKPOINT_STALE,
                        f"the store holds {len(commits)} commit(s); at least {wanted} were committed: "
                        "newer commits were removed (a rollback) or the store is an older copy")
    if expect_head is not None:
        head = parse_head(expect_head)
        if not any(record.certificate_hash == head for record in commits):
            raise error(errors.CHECKPOINT_STALE,
                        f"no commit of the store has head {head.hex()} (it holds {len(commits)} commit(s)): "
                        "the store was rolled back past that commit, is an older copy, or was rewritten")
