"""Mixed pretraining sequences: a weighted mixture of datasets' cut sequences, exact per window
(``plan cut --mix``; plans/windows/sequence_mixture.py).

What goes in: a mixture of pretraining sequences folder (each component's tokens reopened from what it
records). What comes out: :data:`KIND`, whose ``plan info`` report holds the definition, each dataset's cut and
the epochs of it read, its schedule's pieces (when it has one), the segments (from meta.json and the indices: no
window merged) and, with a world size, each rank's samples under the resume rule (global sample ``k`` to rank
``k mod R``).
"""

from __future__ import annotations

from ..explain.rows import pieces_unit
from ..sharding import share_ranks
from ..windows.resume import rank_indices
from ..windows.schedule import MixSchedule
from ..windows.sequences_io import MIXED_SEQUENCES, load_mixed_sequences, save_mixed_sequences
from ..windows.verify import verify_mixed_sequences
from .kind import PlanKind


def report(folder, *, world_size: int | None = None, rank: int | None = None) -> dict:
    """``plan info``'s report of a mixture of pretraining sequences (module docstring)."""
    ranks = share_ranks(world_size, rank)
    mixture = load_mixed_sequences(folder)
    ends = mixture.blend.stream_ends()
    out = {"plan": str(folder), "kind": KIND.name, "fingerprint": mixture.fingerprint, "window": mixture.window,
           "samples": mixture.total, "windows": mixture.num_windows, "seed": mixture.seed,
           "components": [{"name": c.name, "weight": c.weight, "max_epochs": c.max_epochs,
                           "definition": c.sequences.definition.to_dict(), "documents": c.sequences.lengths.count,
                           "epoch_tokens": c.sequences.epoch_tokens(0), "epoch_samples": mixture.per_epoch[i],
                           "epochs_read": c.sequences.num_epochs, "samples_read": ends[i],
                           "fingerprint": c.sequences.fingerprint}
                          for i, c in enumerate(mixture.components)],
           "segments": [{"first": s.first, "windows": s.windows, "size": s.size, "quotas": list(s.quotas)}
                        for s in mixture.blend.segments]}
    if mixture.schedule is not None:
        out["schedule"] = mixture.schedule.describe([c.name for c in mixture.components])
    if ranks:
        out["ranks"] = [{"rank": r, "samples": len(rank_indices(0, mixture.total, r, world_size or 1))} for r in ranks]
    return out


def lines(report: dict) -> list[str]:
    """The text of ``plan info`` for :func:`report`'s dict."""
    out = [f"mixed pretraining sequences {report['plan']}: {report['samples']} samples in {report['windows']} "
           f"windows of {report['window']}, seed {report['seed']}, fingerprint {report['fingerprint']}"]
    for c in report["components"]:
        cap = "no cap" if c["max_epochs"] is None else f"at most {c['max_epochs']} epoch(s)"
        d = c["definition"]
        out.append(f"  {c['name']}: weight {c['weight']}, seed {d['seed']}, {c['documents']} documents, "
                   f"{c['epoch_tokens']} tokens and {c['epoch_samples']} samples of {d['sequence_length']} + 1 an "
                   f"epoch ({d['tail']} tail), {cap}; {c['samples_read']} samples read over {c['epochs_read']} "
                   "epoch(s)")
    out += MixSchedule.lines(report.get("schedule", []))
    out += [f"  windows {seg['first']} to {seg['first'] + seg['windows'] - 1}: {seg['size']} samples, "
            f"quotas {seg['quotas']}" for seg in report["segments"]]
    out += [f"    rank {row['rank']}: {row['samples']} samples" for row in report.get("ranks", [])]
    return out


def explain_unit(mixture, epoch: int, k: int, tokens=None) -> dict:
    """Sample ``k`` of the mixture, a row per piece of a document of its component (``plan explain``), ids
    ``name:row``, loss tokens from the component's token source (``tokens`` is None: the explainer gives cut plans
    no other)."""
    mixture.epoch_microbatches(epoch)  # PLAN_CURSOR_INVALID unless epoch 0
    i, component_epoch, j = mixture.locate(k)
    component = mixture.components[i]
    sequences = component.sequences
    pieces = sequences.pieces(component_epoch, j)
    return pieces_unit(k, pieces, sequences.lengths if sequences.tokens is None else sequences.tokens,
                       ids=[f"{component.name}:{piece.row}" for piece in pieces], component=component.name,
                       component_epoch=component_epoch)


KIND = PlanKind(MIXED_SEQUENCES, order="mixture", scope="windows", unit="sample", rows=False,
                open=load_mixed_sequences, save=save_mixed_sequences, verify=verify_mixed_sequences, report=report,
                lines=lines, verify_options=frozenset({"expected_fingerprint", "windows", "seed"}),
                explain=explain_unit)
