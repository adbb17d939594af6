"""The mixed plan: a weighted mixture of datasets planned into token-budget microbatches, a mixed window at a time
(plans/windows/mixture.py, mixed.py).

What goes in: a mixed plan folder (opened with each component's recorded source). What comes out:
:data:`KIND`, whose ``plan info`` report holds the definition, its schedule's pieces (when it has one), its
segments and the index's totals (no window planned) and, with a world size, each rank's microbatches under the
resume rule (global microbatch ``k`` to rank ``k mod R``). Its microbatches hold rows of its components one
after another (``rows``: a batch sampler, a collator and ``batch generate`` take it; no whole plan holds a
mixture, so ``plan shard`` does not).
"""

from __future__ import annotations

import numpy as np

from ..explain.rows import component_sources, microbatch_unit
from ..sharding import share_ranks
from ..windows.index import locate
from ..windows.io import MIXED_PLAN, load_mixed_plan, save_mixed_plan, save_mixed_plan_into
from ..windows.mixed import MixedPlan
from ..windows.mixture import MixedWindow
from ..windows.resume import rank_indices
from ..windows.schedule import MixSchedule
from ..windows.verify import verify_mixed_plan
from .kind import PlanKind


def report(folder, *, world_size: int | None = None, rank: int | None = None) -> dict:
    """``plan info``'s report of a mixed plan (module docstring)."""
    ranks = share_ranks(world_size, rank)
    plan = load_mixed_plan(folder)
    d = plan.definition
    pack = d.config.pack
    out = {"plan": str(folder), "kind": KIND.name, "fingerprint": plan.fingerprint, "config": d.config.to_dict(),
           "pack_config": None if pack is None else pack.to_dict(), "window": d.window, "samples": d.total,
           "windows": d.num_windows, "unit": d.unit,
           "components": [{"name": c.name, "weight": c.weight, "seed": c.seed, "max_epochs": c.max_epochs,
                           "count": c.source.count} for c in d.components],
           "segments": [{"first": s.first, "windows": s.windows, "size": s.size, "quotas": list(s.quotas)}
                        for s in d.segments],
           "counts": plan.counts()}
    if d.schedule is not None:
        out["schedule"] = d.schedule.describe([c.name for c in d.components])
    if ranks:
        out["ranks"] = [{"rank": r, "microbatches": len(rank_indices(0, plan.num_microbatches, r, world_size or 1))}
                        for r in ranks]
    return out


def lines(report: dict) -> list[str]:
    """The text of ``plan info`` for :func:`report`'s dict."""
    out = [f"mixed plan {report['plan']}: {report['samples']} samples in {report['windows']} windows of "
           f"{report['window']}, fingerprint {report['fingerprint']}",
           f"  weights count {report['unit'].replace('_', ' ')}"]
    packing = report["pack_config"]
    if packing is not None:
        out.append(f"  packed: {packing['mode']}, rows of {packing['max_length']} tokens, separator "
                   f"{packing['separator_len']}")
    for c in report["components"]:
        cap = "no cap" if c["max_epochs"] is None else f"at most {c['max_epochs']} epoch(s)"
        out.append(f"  {c['name']}: weight {c['weight']}, seed {c['seed']}, {c['count']} samples, {cap}")
    out += MixSchedule.lines(report.get("schedule", []))
    out += [f"  windows {seg['first']} to {seg['first'] + seg['windows'] - 1}: {seg['size']} positions, "
            f"quotas {seg['quotas']}" for seg in report["segments"]]
    counts = report["counts"]
    out.append(f"  {counts['microbatches']} microbatches, {counts['samples']} samples, {counts['skipped']} skipped, "
               f"{counts['tokens']} tokens, {counts['padded_tokens']} padded tokens")
    out += [f"    rank {row['rank']}: {row['microbatches']} microbatches" for row in report.get("ranks", [])]
    return out


def explain_unit(plan, epoch: int, k: int, tokens=None) -> dict:
    """Microbatch ``k`` of the mixture, row by row (``plan explain``): each sample's component, that component's
    epoch and its row there, read from the mixed window that planned it; loss tokens from ``tokens`` (one source
    per component), else each component's source when it holds tokens."""
    spec = plan.microbatch_at(epoch, k)
    m, local = locate(plan.index, 0, k)
    planned = plan.window(m)  # the window the microbatch came from (kept: not planned again)
    offsets = planned.arrays.offsets
    at = (np.asarray(planned.arrays.samples[int(offsets[local]):int(offsets[local + 1])], dtype=np.uint64)
          - np.uint64(m * plan.definition.window)).astype(np.int64)
    mixed = MixedWindow(planned.mixed.component[at], planned.mixed.epoch[at], planned.mixed.row[at])
    definition = plan.definition
    sources = list(definition.sources) if tokens is None else component_sources(tokens, definition.sources)
    names = [c.name for c in definition.components]
    return microbatch_unit(spec, mixed.lengths(definition.sources), [sources[c] for c in mixed.component.tolist()],
                           components=[names[c] for c in mixed.component.tolist()],
                           component_epochs=mixed.epoch.tolist(), documents=mixed.row.astype(np.int64), window=m)


KIND = PlanKind(MIXED_PLAN, order="mixture", scope="windows", unit="microbatch", rows=True, open=load_mixed_plan,
                save=save_mixed_plan, verify=verify_mixed_plan, report=report, lines=lines,
                verify_options=frozenset({"expected_fingerprint", "windows", "seed"}), plan_type=MixedPlan,
                save_into=save_mixed_plan_into, explain=explain_unit)
