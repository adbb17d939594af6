"""Pretraining sequences: one dataset's documents in the engine's order, joined and cut into samples of
``L + 1`` tokens, a window of documents at a time (``plan cut``; plans/windows/cut.py, sequences.py).

What goes in: a pretraining sequences folder (opened with its recorded token source). What comes out:
:data:`KIND`, whose ``plan info`` report holds the definition and each epoch's tokens and samples from the
index (no window cut, no token read) and, with a world size, each rank's samples of each epoch under the
resume rule (global sample ``k`` to rank ``k mod R``).
"""

from __future__ import annotations

from typing import Any

from ..explain.rows import pieces_unit
from ..sharding import share_ranks
from ..windows.resume import rank_indices
from ..windows.sequences_io import SEQUENCES, load_sequences, save_sequences
from ..windows.verify import verify_sequences
from .kind import PlanKind


def report(folder, *, world_size: int | None = None, rank: int | None = None) -> dict:
    """``plan info``'s report of pretraining sequences (module docstring)."""
    ranks = share_ranks(world_size, rank)
    plan = load_sequences(folder)
    d = plan.definition
    epochs: list[dict] = []
    out = {"plan": str(folder), "kind": KIND.name, "fingerprint": plan.fingerprint, "definition": d.to_dict(),
           "windows": d.num_windows, "epochs": epochs}
    for e in range(plan.num_epochs):
        entry: dict[str, Any] = {"epoch": e, "tokens": plan.epoch_tokens(e), "samples": plan.epoch_samples(e)}
        if ranks:
            entry["ranks"] = [{"rank": r, "samples": len(rank_indices(0, entry["samples"], r, world_size or 1))}
                              for r in ranks]
        epochs.append(entry)
    return out


def lines(report: dict) -> list[str]:
    """The text of ``plan info`` for :func:`report`'s dict."""
    d = report["definition"]
    out = [f"pretraining sequences {report['plan']}: {d['num_documents']} documents, samples of "
           f"{d['sequence_length']} + 1 tokens ({d['tail']} tail, eos {d['eos']}), {report['windows']} windows of "
           f"{d['window']}, {d['order']} order, seed {d['seed']}, fingerprint {report['fingerprint']}"]
    for entry in report["epochs"]:
        out.append(f"  epoch {entry['epoch']}: {entry['tokens']} tokens, {entry['samples']} samples")
        out += [f"    rank {row['rank']}: {row['samples']} samples" for row in entry.get("ranks", [])]
    return out


def explain_unit(plan, epoch: int, k: int, tokens=None) -> dict:
    """Sample ``k`` of ``epoch``, a row per piece of a document (``plan explain``), loss tokens from the token
    source it was cut from (``tokens`` is None: the explainer gives cut plans no other)."""
    return pieces_unit(k, plan.pieces(epoch, k), plan.lengths if plan.tokens is None else plan.tokens)


KIND = PlanKind(SEQUENCES, order="dataset", scope="windows", unit="sample", rows=False, open=load_sequences,
                save=save_sequences, verify=verify_sequences, report=report, lines=lines,
                verify_options=frozenset({"expected_fingerprint", "windows", "seed"}), explain=explain_unit)
