"""``ReplayBuffer(max_size)``: a bounded store of stream samples, replayable bit for bit.

Samples get a key as they are added (0, 1, 2, ...: the order of ``add``
calls, dropped ones included). While the buffer has room a sample takes the
next free slot; once it is full the eviction policy decides:

- ``fifo``: the oldest sample (smallest key) leaves.
- ``lowest_priority``: the sample of lowest priority leaves, the oldest of
  equal ones; a new sample whose priority is below every stored one is
  dropped instead (it would be the first to leave).
- ``reservoir``: Vitter's algorithm R: the ``k``-th sample offered
  (0-based, ``k >= max_size``) replaces slot ``j = w mod (k + 1)``, ``w`` a
  64-bit draw of the ``eviction`` sub-stream, when ``j < max_size``, else
  it is dropped; every sample offered so far is then in the buffer with the
  same probability ``max_size / (k + 1)``.

``sample(n)`` draws ``n`` samples with replacement, sample ``i`` with
probability ``p_i^alpha / sum_j p_j^alpha`` (``alpha`` is
``priority_exponent``; 0 gives uniform draws), from the ``sample``
sub-stream, over the samples in key order. All randomness comes from
:class:`~.rng.BufferRng`, keyed by the run's manifest.

``state_dict()`` is what a checkpoint stores: the configuration, the RNG
key and offsets, and which key each slot holds with its priority and draw
count (arrays as bytes, a few items whatever the size). The samples
themselves are not in it: they are recorded in the window log, and
:meth:`ReplayBuffer.load_state_dict` takes them from there by key.
"""

from __future__ import annotations

import enum
import heapq
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ... import checks, errors
from ...errors import UmlosError
from .rng import BufferRng, stream_manifest
from ..failures import failure
from .snapshot import BufferSnapshot
from ..types import StreamSample

STATE_FORMAT = "umlos-cuda/replay-buffer-v1"
#: The largest buffer.
MAX_SIZE = 1 << 26
#: Slots allocated at first; the arrays double as samples arrive, up to max_size.
INITIAL_SLOTS = 1024
_STATE_KEYS = {"format", "max_size", "eviction", "priority_exponent", "rng", "added", "next_fifo", "slots",
               "priorities", "draw_counts"}


class EvictionPolicy(str, enum.Enum):
    FIFO = "fifo"
    LOWEST_PRIORITY = "lowest_priority"
    RESERVOIR = "reservoir"

    @classmethod
    def parse(cls, value: Any) -> EvictionPolicy:
        for policy in cls:
            if value == policy or value == policy.value:
                return policy
        raise failure(errors.REPLAY_BUFFER_INVALID,
                      f"eviction must be one of {', '.join(p.value for p in cls)}, got {value!r}")


class ReplayBuffer:
    """A bounded replay buffer (see the module docstring).

    Args:
        max_size: slots, in [1, 2^26].
        eviction: ``fifo``, ``lowest_priority`` or ``reservoir``.
        manifest: the run's manifest (a Manifest, mapping or path) that keys
            the RNG; without one, a placeholder manifest of ``seed``.
        replay_token: overrides the manifest's ``kernel_replay_token``.
        priority_exponent: ``alpha`` of priority sampling (>= 0).
        rng: a :class:`BufferRng` to use instead (replay passes the recorded key).
    """

    def __init__(self, max_size: int = 100_000, eviction: Any = "fifo", *, manifest: Any = None,
                 replay_token: bytes | None = None, seed: int = 0, priority_exponent: float = 1.0,
                 rng: BufferRng | None = None) -> None:
        self.max_size = checks.integer(max_size, "max_size", 1, MAX_SIZE, fail=_invalid,
                                       message="{name} must be an integer in [1, 2^26], got {value!r}")
        self.priority_exponent = checks.number(priority_exponent, "priority_exponent", at_least=0, fail=_invalid,
                                               message="{name} must be a finite number >= 0, got {value!r}")
        self.eviction = EvictionPolicy.parse(eviction)
        self.rng = rng if rng is not None else BufferRng.from_manifest(
            manifest if manifest is not None else stream_manifest(seed), replay_token)
        # Slot arrays grow with the samples held (doubling, up to max_size), so memory follows what
        # the buffer holds, not what a configuration or a window log's header asks for.
        self._slots = np.full(0, -1, dtype=np.int64)  # the key each slot holds, -1 when empty
        self._priorities = np.zeros(0, dtype=np.float64)
        self._draw_counts = np.zeros(0, dtype=np.int64)
        self._lengths = np.zeros(0, dtype=np.uint32)
        self._digests = np.zeros((0, 32), dtype=np.uint8)
        self._samples: list[StreamSample | None] = []
        self._reserve(min(max_size, INITIAL_SLOTS))
        self._size = 0
        self.added = 0  # samples offered so far: the next key
        self._next_fifo = 0
        self._heap: list[tuple[float, int, int]] = []  # (priority, key, slot), stale entries skipped
        self._journal: list[tuple[int, StreamSample, float]] = []

    # -- adding ----------------------------------------------------------------------------
    def add(self, sample: StreamSample, priority: float | None = None) -> bool:
        """Offer ``sample`` (priority: ``sample.priority`` unless given); True when it was stored."""
        if not isinstance(sample, StreamSample):
            raise failure(errors.REPLAY_BUFFER_INVALID,
                          f"a buffer holds StreamSample objects, got {type(sample).__name__}")
        priority = sample.priority if priority is None else priority
        priority = checks.number(priority, "priority", above=0, fail=_invalid,
                                 message="a priority is a positive finite number, got {value!r}")
        key = self.added
        self.added += 1
        self._journal.append((key, sample, priority))
        slot = self._slot_for(key, priority)
        if slot is None:
            return False
        self._put(slot, key, sample, float(priority))
        return True

    def _reserve(self, slots: int) -> None:
        """Room for at least ``slots`` slots (at most max_size); new slots are empty."""
        have = self._slots.shape[0]
        if slots <= have:
            return
        grown = min(self.max_size, max(slots, 2 * have))
        extra = grown - have
        self._slots = np.concatenate([self._slots, np.full(extra, -1, dtype=np.int64)])
        self._priorities = np.concatenate([self._priorities, np.zeros(extra, dtype=np.float64)])
        self._draw_counts = np.concatenate([self._draw_counts, np.zeros(extra, dtype=np.int64)])
        self._lengths = np.concatenate([self._lengths, np.zeros(extra, dtype=np.uint32)])
        self._digests = np.concatenate([self._digests, np.zeros((extra, 32), dtype=np.uint8)])
        self._samples.extend([None] * extra)

    def _slot_for(self, key: int, priority: float) -> int | None:
        if self._size < self.max_size:
            self._reserve(self._size + 1)
            self._size += 1
            return self._size - 1
        if self.eviction is EvictionPolicy.FIFO:
            slot = self._next_fifo
            self._next_fifo = (slot + 1) % self.max_size
            return slot
        if self.eviction is EvictionPolicy.RESERVOIR:
            j = int(self.rng.words64("eviction", 1)[0] % np.uint64(key + 1))
            return j if j < self.max_size else None
        while True:  # lowest priority: skip heap entries of overwritten slots
            low, old_key, slot = self._heap[0]
            if self._slots[slot] == old_key:
                break
            heapq.heappop(self._heap)
        if priority < low:
            return None
        heapq.heappop(self._heap)
        return slot

    def _put(self, slot: int, key: int, sample: StreamSample, priority: float) -> None:
        self._slots[slot] = key
        self._priorities[slot] = priority
        self._draw_counts[slot] = 0
        self._lengths[slot] = sample.length
        self._digests[slot] = np.frombuffer(bytes.fromhex(sample.digest), dtype=np.uint8)
        self._samples[slot] = sample
        if self.eviction is EvictionPolicy.LOWEST_PRIORITY:
            heapq.heappush(self._heap, (priority, key, slot))

    def drain_journal(self) -> list[tuple[int, StreamSample, float]]:
        """The ``(key, sample, priority)`` added since the last drain (window logs record them)."""
        journal, self._journal = self._journal, []
        return journal

    @property
    def pending(self) -> int:
        """Samples added since the journal was last drained."""
        return len(self._journal)

    # -- reading ---------------------------------------------------------------------------
    def __len__(self) -> int:
        return self._size

    def _order(self) -> np.ndarray:
        """The occupied slots in key order."""
        occupied = np.flatnonzero(self._slots[:self._size] >= 0)
        return occupied[np.argsort(self._slots[occupied], kind="stable")]

    def snapshot(self) -> BufferSnapshot:
        """The contents now, immutable and fingerprinted (samples in key order)."""
        order = self._order()
        return BufferSnapshot.build(self._slots[order], [self._samples[s] for s in order], self._priorities[order],
                                    self._draw_counts[order], self.added, self._lengths[order], self._digests[order])

    def sample(self, n: int) -> list[StreamSample]:
        """``n`` samples drawn with replacement by priority (see the module docstring)."""
        n = checks.integer(n, "n", 0, None, fail=_invalid, message=checks.NON_NEGATIVE)
        if n and not self._size:
            raise failure(errors.REPLAY_BUFFER_INVALID, "cannot sample from an empty buffer")
        order = self._order()
        weights = self._priorities[order] ** self.priority_exponent
        rows = inverse_cdf(weights, self.rng.uniforms("sample", n))
        return [self._samples[order[r]] for r in rows]

    def record_draws(self, keys: np.ndarray) -> None:
        """Count that the samples of ``keys`` were drawn (window metrics read the counts)."""
        if not len(keys):
            return
        order = self._order()
        positions = np.searchsorted(self._slots[order], keys)
        np.add.at(self._draw_counts, order[positions], 1)

    # -- state -----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Plain data for a checkpoint (see the module docstring)."""
        return {
            "format": STATE_FORMAT,
            "max_size": self.max_size,
            "eviction": self.eviction.value,
            "priority_exponent": self.priority_exponent,
            "rng": self.rng.state_dict(),
            "added": self.added,
            "next_fifo": self._next_fifo,
            "slots": self._slots[:self._size].astype("<i8").tobytes(),
            "priorities": self._priorities[:self._size].astype("<f8").tobytes(),
            "draw_counts": self._draw_counts[:self._size].astype("<i8").tobytes(),
        }

    def load_state_dict(self, state: Any, samples: Mapping[int, StreamSample] | Callable[[int], StreamSample]) -> None:
        """Put back :meth:`state_dict` of a buffer of this run; ``samples`` gives each key's sample."""
        state = check_state(state)
        for name in ("max_size", "eviction", "priority_exponent"):
            mine = getattr(self, name)
            mine = mine.value if isinstance(mine, EvictionPolicy) else mine
            if state[name] != mine:
                raise failure(errors.REPLAY_BUFFER_INVALID,
                              f"the saved buffer has {name} {state[name]!r}, this one {mine!r}")
        self.rng.load_state_dict(state["rng"])
        slots = np.frombuffer(state["slots"], dtype="<i8").astype(np.int64)
        lookup = samples if callable(samples) else samples.__getitem__
        size = slots.shape[0]
        self._reserve(size)
        self._slots[:] = -1
        self._slots[:size] = slots
        self._priorities[:] = 0
        self._priorities[:size] = np.frombuffer(state["priorities"], dtype="<f8")
        self._draw_counts[:] = 0
        self._draw_counts[:size] = np.frombuffer(state["draw_counts"], dtype="<i8")
        self._samples = [None] * len(self._samples)
        for slot, key in enumerate(slots.tolist()):
            if key >= 0:
                try:
                    sample = lookup(key)
                except (KeyError, IndexError):
                    raise failure(errors.REPLAY_BUFFER_INVALID,
                                  f"no recorded sample for key {key} held by the saved buffer "
                                  "(is the window log of this run?)") from None
                self._samples[slot] = sample
                self._lengths[slot] = sample.length
                self._digests[slot] = np.frombuffer(bytes.fromhex(sample.digest), dtype=np.uint8)
        self._size = size
        self.added = state["added"]
        self._next_fifo = state["next_fifo"]
        self._heap = [(float(self._priorities[s]), int(k), s) for s, k in enumerate(slots.tolist()) if k >= 0] \
            if self.eviction is EvictionPolicy.LOWEST_PRIORITY else []
        heapq.heapify(self._heap)
        self._journal = []

    def keys_needed(self, state: Any) -> set[int]:
        """The keys of the samples a saved state holds."""
        return {int(k) for k in np.frombuffer(check_state(state)["slots"], dtype="<i8") if k >= 0}



#: A saved state's keys (:func:`check_state` checks their values), and the start of its message.
_STATE_FIELDS = dict.fromkeys(sorted(_STATE_KEYS), checks.field(checks.anything))
_STATE_SHAPE = checks.literal(f"a buffer state has exactly the keys {', '.join(_STATE_FIELDS)}; got ")

def check_state(state: Any) -> dict[str, Any]:
    """``state`` if it has the layout of :meth:`ReplayBuffer.state_dict`, else REPLAY_BUFFER_INVALID."""
    checks.record(state, _STATE_FIELDS, fail=_invalid, not_a_map=_STATE_SHAPE + "{type}",
                  unknown=_STATE_SHAPE + "{keys}", missing=_STATE_SHAPE + "{keys}")
    if state["format"] != STATE_FORMAT:
        raise failure(errors.REPLAY_BUFFER_INVALID, f"buffer state format {state['format']!r} is not {STATE_FORMAT!r}")
    for name in ("max_size", "added", "next_fifo"):
        checks.integer(state[name], name, 0, None, fail=_invalid, strict=True,
                       message="buffer state {name} must be a non-negative integer, got {value!r}")
    wrong = "buffer state {name} must be bytes of one 8-byte value per slot, as many as slots"
    size_bytes = len(checks.instance(state["slots"], "slots", bytes, fail=_invalid, message=wrong))
    if size_bytes % 8:
        raise _invalid(wrong.format(name="slots"))
    for name in ("priorities", "draw_counts"):
        checks.instance(state[name], name, bytes, length=size_bytes, fail=_invalid, message=wrong)
    if size_bytes // 8 > state["max_size"]:
        raise failure(errors.REPLAY_BUFFER_INVALID, "buffer state holds more slots than max_size")
    slots = np.frombuffer(state["slots"], dtype="<i8")
    held = slots[slots >= 0]
    if (slots < -1).any() or (held >= state["added"]).any() or np.unique(held).shape[0] != held.shape[0]:
        raise failure(errors.REPLAY_BUFFER_INVALID, "buffer state slots must hold distinct keys below 'added' (or -1)")
    priorities = np.frombuffer(state["priorities"], dtype="<f8")
    if not np.all(np.isfinite(priorities[slots >= 0])) or (priorities[slots >= 0] <= 0).any():
        raise failure(errors.REPLAY_BUFFER_INVALID, "buffer state priorities must be positive and finite")
    return dict(state)


def inverse_cdf(weights: np.ndarray, uniforms: np.ndarray) -> np.ndarray:
    """Rows drawn with probability ``weights / weights.sum()``, one per uniform."""
    cumulative = np.cumsum(weights, dtype=np.float64)
    total = cumulative[-1] if cumulative.size else 0.0
    if not total > 0:
        raise failure(errors.REPLAY_BUFFER_INVALID, "every sample has weight 0: nothing can be drawn")
    rows = np.searchsorted(cumulative, uniforms * total, side="right")
    return np.minimum(rows, cumulative.size - 1)


def _invalid(message: str) -> UmlosError:
    return failure(errors.REPLAY_BUFFER_INVALID, message)
