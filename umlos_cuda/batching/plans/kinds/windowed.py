"""The windowed plan: one dataset's engine order planned a window of W positions at a time (plans/windows/).

What goes in: a windowed plan folder (opened with its recorded source: the index and the lengths'
header, O(N / W)) and optionally a world size and a rank. What comes out: :data:`KIND`, whose ``plan
info`` report is a plain dict (:func:`report`, ``plan info --json``) and its text lines (:func:`lines`).

Everything comes from meta.json and the index: per epoch the totals of
:data:`~.window.COUNT_FIELDS`, the padding waste, a packed plan's rows (``padded_tokens //
max_length``, :mod:`.packed`) and the windows' smallest and largest microbatch counts. With a
world size, each rank's microbatches under the rule of :mod:`.resume` (global microbatch ``k`` to
rank ``k mod R``); per-rank samples and tokens would need every window planned, so they are not listed.
"""

from __future__ import annotations

import numpy as np

from ..explain.rows import microbatch_unit
from ..sharding import share_ranks
from ..windows.index import locate
from ..windows.io import WINDOWED_PLAN, load_windowed_plan, save_windowed_plan, save_windowed_plan_into
from ..windows.plan import WindowedPlan
from ..windows.resume import rank_indices
from ..windows.verify import verify_windowed_plan
from ..windows.window import COUNT_FIELDS
from .kind import PlanKind
from .whole import config_words, packed_line


def report(folder, *, world_size: int | None = None, rank: int | None = None) -> dict:
    """``plan info``'s report of a windowed plan (see the module docstring)."""
    ranks = share_ranks(world_size, rank)
    world = world_size or 1
    plan = load_windowed_plan(folder)
    definition, config = plan.definition, plan.config
    pack = config.pack
    report: dict = {"plan": str(folder), "kind": WINDOWED_PLAN.name, "fingerprint": plan.fingerprint,
                    "config": config.to_dict(),
                    "pack_config": None if pack is None else pack.to_dict(),
                    "window": {**definition.to_dict(), "num_windows": definition.num_windows},
                    "lengths": plan.source.binding(), "epochs": []}
    for epoch in range(plan.num_epochs):
        stats: dict = {"epoch": epoch, **plan.epoch_counts(epoch)}
        padded, tokens = stats["padded_tokens"], stats["tokens"]
        stats["padding_waste"] = round((padded - tokens) / padded, 9) if padded else 0.0
        if pack is not None:
            stats["rows"] = padded // pack.max_length
        per_window = np.diff(plan.index[epoch, :, COUNT_FIELDS.index("microbatches")])
        stats["window_microbatches"] = {"min": int(per_window.min()), "max": int(per_window.max())}
        if ranks:
            stats["ranks"] = [{"rank": r, "microbatches": len(rank_indices(0, stats["microbatches"], r, world))}
                              for r in ranks]
        report["epochs"].append(stats)
    return report


def lines(report: dict) -> list[str]:
    """The text of ``plan info`` for :func:`report`'s dict."""
    config, window, pack = report["config"], report["window"], report["pack_config"]
    out = [f"windowed plan {report['plan']}", f"  fingerprint {report['fingerprint']}",
           f"  {window['num_samples']} samples, {len(report['epochs'])} epoch(s) of {window['num_windows']} windows "
           f"of {window['window']} (edge {window['edge']}), {config_words(config)}"]
    if pack is not None:
        out.append(packed_line(config, pack))
    for stats in report["epochs"]:
        rows = f", {stats['rows']} rows" if "rows" in stats else ""
        out.append(f"  epoch {stats['epoch']}: {stats['microbatches']} microbatches{rows}, {stats['samples']} "
                     f"samples, {stats['skipped']} skipped, {stats['tokens']} tokens, padding_waste "
                     f"{stats['padding_waste']:.4f}, {stats['window_microbatches']['min']} to "
                     f"{stats['window_microbatches']['max']} microbatches a window")
        for row in stats.get("ranks", []):
            out.append(f"    rank {row['rank']}: {row['microbatches']} microbatches")
    return out


def explain_unit(plan: WindowedPlan, epoch: int, k: int, tokens=None) -> dict:
    """Global microbatch ``k`` of ``epoch``, row by row (``plan explain``): one window planned; loss tokens from
    ``tokens``, else from the recorded source when it holds tokens."""
    spec = plan.microbatch_at(epoch, k)
    return microbatch_unit(spec, plan.source.take(spec.rows), plan.source if tokens is None else tokens,
                           window=locate(plan.index, epoch, k)[0])


KIND = PlanKind(WINDOWED_PLAN, order="dataset", scope="windows", unit="microbatch", rows=True, open=load_windowed_plan,
                save=save_windowed_plan, verify=verify_windowed_plan, report=report, lines=lines,
                verify_options=frozenset({"expected_fingerprint", "windows", "seed", "lengths"}),
                whole=WindowedPlan.as_batch_plan, plan_type=WindowedPlan, save_into=save_windowed_plan_into,
                explain=explain_unit)
