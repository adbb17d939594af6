"""Windowed plans: token-budget microbatches planned a window of the engine's order at a time.

Modules:
    sources  where the lengths come from: a length cache's ``.u32`` sidecar (memory-mapped), an array, a seeded formula
    window   the definition (config, window W, edge rule) and one window's microbatches or counts
    packed   a packed windowed plan's window counts (rows x max_length padded) and its row checks
    index    the per-window running counts, built in one streaming pass; microbatch -> window
    plan     :class:`WindowedPlan`: random access, resume, fingerprint
    resume   rank r of R reads the global microbatches k mod R == r from the checkpoint's plan cursor
    io       windowed plan folders: meta.json and index.npy, written atomically, read bounded
    verify   a folder's definition, lengths and any sample of its windows replanned and checked

docs/batching.md, "Windowed plans", is the normative definition.
"""

from .index import build_index, locate
from .io import load_windowed_plan, save_windowed_plan
from .plan import WindowedPlan
from .sources import ArrayLengths, LengthSource, MappedLengths, SyntheticLengths
from .verify import verify_windowed_plan
from .window import DEFAULT_WINDOW, EDGE_FLUSH, WindowDefinition, count_window, plan_window

__all__ = ["DEFAULT_WINDOW", "EDGE_FLUSH", "ArrayLengths", "LengthSource", "MappedLengths", "SyntheticLengths",
           "WindowDefinition", "WindowedPlan", "build_index", "count_window", "load_windowed_plan", "locate",
           "plan_window", "save_windowed_plan", "verify_windowed_plan"]
