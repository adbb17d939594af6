"""One window of a windowed plan: its microbatches, or only how many there are.

What goes in: a :class:`WindowDefinition` (the batching config, the window size ``W``,
the number of samples ``N``, the edge rule), a :class:`~.sources.LengthSource`, an
epoch and a window number ``w``. What comes out: :func:`plan_window` gives the
window's microbatches (:class:`~..planner.EpochArrays`, dataset rows, skipped rows);
:func:`count_window` gives only their counts (:class:`WindowCounts`), which is
what the index (:mod:`.index`) needs and is cheaper: no interleaving, no gather.

The rules (docs/batching.md, "Windowed plans"): window ``w`` of an epoch is the
positions ``[w W, min((w + 1) W, N))`` of the epoch's order, the engine's order of
the whole-epoch planner (:func:`~..planner.plan_manifest`, :func:`~..planner.order_slice`).
It is planned from those positions alone by the whole-epoch planner's steps 2 to 4
(:func:`~..planner.plan_ordered`): buckets, cuts per bucket in position order, and
the jittered stratified interleaving, whose draws are numbered ``w 2^32 + j``.
Edge rule ``flush``: a bucket's last microbatch in a window ends with the window
(it may hold fewer samples than the budget allows); nothing carries into the next
window. So the window with ``W >= N`` is exactly the whole-epoch planner's epoch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .... import checks
from ....manifest.core import Manifest
from ..buckets import config_error
from ....nextbatch import MODE_SEQUENTIAL
from ..config import MAX_WINDOW, BatchingConfig, PadPolicy
from ..planner import EpochArrays, cut_bucket, order_slice, plan_manifest, plan_positions
from .packed import count_packed

#: The one edge rule: each window ends every bucket's open microbatch (see the module docstring).
EDGE_FLUSH = "flush"
EDGE_RULES = (EDGE_FLUSH,)
#: The default window: microbatch k at random plans 2^16 positions (milliseconds); 2^16 divides the engine's
#: default block size, so a block mode's window reads its lengths from one block.
DEFAULT_WINDOW = 1 << 16
#: The count columns of the index, in order (:class:`WindowCounts`).
COUNT_FIELDS = ("microbatches", "samples", "skipped", "tokens", "padded_tokens")


def check_windowed_config(config: BatchingConfig) -> BatchingConfig:
    """BATCHING_CONFIG_INVALID unless ``config`` is a token-budget bucket plan, packed or not
    (:mod:`.packed`), a window can plan today."""
    if not isinstance(config, BatchingConfig):
        raise config_error(f"batching_config must be a BatchingConfig, got {type(config).__name__}")
    for name, what in (("overlong", "an over-long policy"), ("split", "a split")):
        if getattr(config, name) is not None:
            raise config_error(f"windowed plans take no {what} yet (config.{name}); they plan token-budget buckets, "
                               "packed or not")
    if config.group_size != 1:
        raise config_error("windowed plans take no preference pairs yet (group_size must be 1)")
    if config.window is not None:
        raise config_error("a windowed plan's window is its definition's (WindowDefinition.window), not the config's")
    return config


@dataclass(frozen=True)
class WindowDefinition:
    """Everything that decides a windowed plan besides the lengths: ``config``, ``num_samples`` (N),
    ``window`` (W, default :data:`DEFAULT_WINDOW`) and ``edge`` (:data:`EDGE_RULES`); ``manifest`` is
    the order's."""

    config: BatchingConfig
    num_samples: int
    window: int = DEFAULT_WINDOW
    edge: str = EDGE_FLUSH
    manifest: Manifest = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_windowed_config(self.config)
        checks.integer(self.window, "window", 1, MAX_WINDOW, fail=config_error)
        checks.integer(self.num_samples, "num_samples", 1, None, fail=config_error, message=checks.AT_LEAST)
        checks.choice(self.edge, "edge", EDGE_RULES, fail=config_error)
        object.__setattr__(self, "manifest", plan_manifest(self.config, self.num_samples))

    @property
    def num_windows(self) -> int:
        """Windows per epoch: ``ceil(N / W)``."""
        return -(-self.num_samples // self.window)

    @property
    def local_reads(self) -> bool:
        """Whether a window's rows lie close together (the sequential order, or a block order, whose
        window of at most a block reads one block of rows): then the length pages a window mapped are
        released after it (:meth:`~.sources.LengthSource.release`). Under ``feistel`` a window's rows
        are spread over the whole file, so releasing would only make the next window map them again."""
        return self.config.stage == MODE_SEQUENTIAL or self.config.order != "feistel"

    def bounds(self, w: int) -> tuple[int, int]:
        """Positions ``[start, stop)`` of window ``w``."""
        start = w * self.window
        return start, min(start + self.window, self.num_samples)

    def to_dict(self) -> dict:
        return {"window": self.window, "edge": self.edge, "num_samples": self.num_samples}


@dataclass(frozen=True)
class WindowCounts:
    """What the index records of one window (:data:`COUNT_FIELDS`)."""

    microbatches: int
    samples: int
    skipped: int
    tokens: int
    padded_tokens: int

    def as_tuple(self) -> tuple[int, ...]:
        return tuple(getattr(self, name) for name in COUNT_FIELDS)


def window_rows(definition: WindowDefinition, epoch: int, w: int, backend: str = "auto") -> np.ndarray:
    """The dataset rows at window ``w``'s positions, in order."""
    start, stop = definition.bounds(w)
    return order_slice(definition.config, definition.manifest, definition.num_samples, epoch, start, stop - start,
                       backend)


def plan_window(definition: WindowDefinition, source, epoch: int, w: int, backend: str = "auto") -> EpochArrays:
    """Window ``w``'s microbatches (see the module docstring; :func:`~..planner.plan_positions`, which a whole
    plan made by windows runs too): dataset rows, skipped rows ascending."""
    start, stop = definition.bounds(w)
    arrays = plan_positions(source.take, definition.config, definition.manifest, definition.num_samples, epoch,
                            start, stop, w, backend)
    if definition.local_reads:
        source.release()
    return arrays


def count_window(definition: WindowDefinition, source, epoch: int, w: int, backend: str = "auto") -> WindowCounts:
    """The counts of :func:`plan_window`'s microbatches, without building them."""
    rows = window_rows(definition, epoch, w, backend)
    lengths = source.take(rows)
    if definition.local_reads:
        source.release()
    return count_lengths(lengths, definition.config)


def count_lengths(lengths: np.ndarray, config: BatchingConfig) -> WindowCounts:
    """:class:`WindowCounts` of the microbatches the planner cuts from ``lengths`` in this order."""
    if config.pack is not None:
        return WindowCounts(*count_packed(lengths, config))
    spec = config.bucket_spec
    skipped, groups = spec.groups(lengths)
    microbatches = padded = tokens = 0
    for k, bucket_lengths in groups:
        tokens += int(bucket_lengths.sum(dtype=np.uint64))
        if config.pad_policy is PadPolicy.PAD_TO_BUCKET:
            per = config.token_budget // int(spec.max_lengths[k])
            microbatches += -(-int(bucket_lengths.shape[0]) // per)
            padded += int(bucket_lengths.shape[0]) * int(spec.max_lengths[k])
            continue
        starts, longest = cut_bucket(bucket_lengths, k, config)
        counts = np.diff(np.append(starts, bucket_lengths.shape[0]))
        microbatches += int(starts.shape[0])
        padded += int((counts * longest.astype(np.int64)).sum())
    return WindowCounts(microbatches, int(lengths.shape[0]) - skipped, skipped, tokens, padded)

