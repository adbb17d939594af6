"""``RollingBatchPlanWindow``: batch plans over rolling snapshots of a replay buffer.

Each :meth:`RollingBatchPlanWindow.next_window`:

1. takes the samples added since the last window from the buffer's journal
   and a :class:`~..buffer.snapshot.BufferSnapshot`;
2. selects rows: every sample of the snapshot once, or, with a
   :class:`~..curriculum.policies.ComposedPolicy`, ``samples_per_window`` draws of it
   (the ``policy`` sub-stream);
3. draws the window's plan seed (two words of the ``window`` sub-stream)
   and builds a one-epoch plan over the selected samples' lengths with the
   batching planner (``BatchPlanBuilder``; the engine's order, buckets,
   token budget; packed rows when the batching configuration has a
   :class:`~umlos_cuda.batching.packing.config.PackingConfig`): the window is its
   first ``window_microbatches`` microbatches;
4. records the window in the log: the added samples, the snapshot's, plan's
   and window's fingerprints, the RNG offsets and the curriculum metrics.

The window fingerprint is SHA-256 of the canonical JSON ``{"plan", "microbatches":
[[sample ids], bucket, max_len] ...}`` of the window's microbatches; a packed
window appends each microbatch's row sizes (samples per packed row), so an
unpacked window's fingerprint is what it always was. The log's header records
the pack configuration (key ``pack``, present only for packed windows), so
``gym replay`` rebuilds packed windows identically.

Checkpoints are taken between windows (:meth:`state_dict` refuses while
samples added since the last window are not in the log yet): the buffer's
state, the window count and the policies' state. :meth:`resume` rebuilds a
window builder from a checkpoint and the run's log, which it cuts back to
the checkpointed windows, and the run goes on as if never stopped.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from ... import checks, errors
from ...errors import UINT64_MAX
from ...batching import BatchingConfig, BatchPlan, BatchPlanBuilder
from ...batching.packing.config import PackingConfig
from ..buffer.rng import BufferRng
from ..curriculum.metrics import window_metrics
from ..failures import failure
from ..curriculum.config import policies_from_data
from ..buffer.replay_buffer import MAX_SIZE, ReplayBuffer, check_state
from ..curriculum.policies import ComposedPolicy
from ..buffer.snapshot import BufferSnapshot
from ..types import StreamSample, canonical_json
from .log import WindowLog, log_path, read_log, truncate_log

STATE_FORMAT = "umlos-cuda/plan-window-v1"
#: The batching configuration windows use unless given one.
DEFAULT_BATCHING: dict[str, Any] = dict(token_budget=16384, bucket_edges=(256, 512, 1024, 2048), overflow_max=4096)


@dataclass(frozen=True)
class Window:
    """One built window."""

    index: int
    snapshot: BufferSnapshot
    rows: np.ndarray  # snapshot rows selected, in draw order
    plan: BatchPlan  # over the selected rows (plan row r is snapshot row rows[r])
    microbatches: tuple[tuple[StreamSample, ...], ...]
    fingerprint: str
    metrics: dict[str, Any]
    build_seconds: float
    pack_sizes: tuple[tuple[int, ...], ...] | None = None  # packed windows: samples per row, per microbatch

    @property
    def plan_fingerprint(self) -> str:
        fingerprint = self.plan.fingerprint
        assert fingerprint is not None  # a built plan has one (only a bare BatchPlanMeta lacks it)
        return fingerprint


class RollingBatchPlanWindow:
    """Windows of ``window_microbatches`` microbatches over ``buffer`` (see the module docstring).

    Args:
        buffer: the :class:`~..buffer.replay_buffer.ReplayBuffer`.
        window_microbatches: microbatches per window (at most; fewer when the plan has fewer).
        batching: the :class:`~umlos_cuda.batching.BatchingConfig` (its seed is replaced per window).
        pack: a :class:`~umlos_cuda.batching.packing.config.PackingConfig` to build packed plans (it replaces
            ``batching.pack``; the configuration's checks apply: ``overflow_max <= max_length <= token_budget``).
        policy: a :class:`~..curriculum.policies.ComposedPolicy`, or None (every sample once).
        samples_per_window: draws per window with a policy (default: the snapshot's size), at most 2^26 (the
            largest buffer's size: the draws are allocated at once).
        log: a path for a new window log, a :class:`~.log.WindowLog`, or None.
        tokenizer_hash: recorded in the plans (``tokenizer_fingerprint`` of the stream's tokenizer).
    """

    def __init__(self, buffer: ReplayBuffer, window_microbatches: int = 1000, *, batching: BatchingConfig | None = None,
                 pack: PackingConfig | None = None, policy: ComposedPolicy | None = None,
                 samples_per_window: int | None = None, log: Any = None,
                 tokenizer_hash: str = "unknown") -> None:
        if not isinstance(buffer, ReplayBuffer):
            raise failure(errors.REPLAY_BUFFER_INVALID, f"buffer must be a ReplayBuffer, got {type(buffer).__name__}")
        # bounded before anything is drawn: a window's draws are allocated (and planned) at once
        for value, name, high in ((window_microbatches, "window_microbatches", UINT64_MAX),
                                  (samples_per_window, "samples_per_window", MAX_SIZE)):
            if value is not None:
                checks.integer(value, name, 1, high, fail=partial(failure, errors.REPLAY_BUFFER_INVALID), strict=True,
                               message=(checks.POSITIVE, "{name} must be an integer in [1, {high}], got {value}"))
        if policy is not None and not isinstance(policy, ComposedPolicy):
            raise failure(errors.SAMPLING_POLICY_INVALID,
                          "policy must be a ComposedPolicy (load_policies, policies_from_data)")
        self.buffer = buffer
        self.window_microbatches = window_microbatches
        self.batching = batching or BatchingConfig.throughput(**DEFAULT_BATCHING)
        if pack is not None:
            self.batching = dataclasses.replace(self.batching, pack=pack)
        self.policy = policy
        self.samples_per_window = samples_per_window
        self.tokenizer_hash = tokenizer_hash
        self.index = 0
        if isinstance(log, WindowLog) or log is None:
            self.log = log
        else:
            self.log = WindowLog(log, self.header())

    def header(self) -> dict[str, Any]:
        """What the log's first line records: enough to rebuild every window."""
        header = {
            "buffer": {"max_size": self.buffer.max_size, "eviction": self.buffer.eviction.value,
                       "priority_exponent": self.buffer.priority_exponent,
                       "rng_key": self.buffer.rng.seed16.hex()},
            "window_microbatches": self.window_microbatches,
            "samples_per_window": self.samples_per_window,
            "batching": self.batching.to_dict(),
            "policies": None if self.policy is None else {"policies": self.policy.to_config()},
            "tokenizer_hash": self.tokenizer_hash,
        }
        if self.batching.pack is not None:  # absent for unpacked windows: their logs keep their bytes
            header["pack"] = self.batching.pack.to_dict()
        return header

    @classmethod
    def from_header(cls, header: Mapping[str, Any], log: Any = None,
                    where: str = "the window log") -> RollingBatchPlanWindow:
        """A fresh builder (empty buffer, offsets 0) configured as the log's header says; a header
        this cannot build from is WINDOW_LOG_INVALID naming ``where`` (the log's path)."""
        try:
            spec = header["buffer"]
            buffer = ReplayBuffer(spec["max_size"], spec["eviction"], priority_exponent=spec["priority_exponent"],
                                  rng=BufferRng(bytes.fromhex(spec["rng_key"])))
            policies = header["policies"]
            pack = header.get("pack")
            return cls(buffer, header["window_microbatches"], batching=BatchingConfig.from_dict(header["batching"]),
                       pack=None if pack is None else PackingConfig.from_dict(pack),
                       policy=None if policies is None else policies_from_data(policies, "the log's policies"),
                       samples_per_window=header["samples_per_window"], log=log,
                       tokenizer_hash=header["tokenizer_hash"])
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise failure(errors.WINDOW_LOG_INVALID, f"{where}: the header is malformed: {exc!r}") from None
        except errors.UmlosError as exc:  # the buffer, batching or policy configuration it records is refused
            raise failure(errors.WINDOW_LOG_INVALID, f"{where}: the header is refused: {exc.code}: {exc.message}") \
                from None

    # -- windows -----------------------------------------------------------------------------
    def add(self, sample: StreamSample, priority: float | None = None) -> bool:
        """``buffer.add``: kept here so a loop feeds one object."""
        return self.buffer.add(sample, priority)

    def next_window(self) -> Window:
        started = time.perf_counter()
        added = self.buffer.drain_journal()
        snapshot = self.buffer.snapshot()
        if not len(snapshot):
            raise failure(errors.REPLAY_BUFFER_INVALID, "the buffer is empty: add samples before building a window")
        if self.policy is None:
            rows = np.arange(len(snapshot), dtype=np.int64)
        else:
            rows = self.policy.select(snapshot, self.samples_per_window or len(snapshot), self.buffer.rng)
        metrics = window_metrics(snapshot, rows)
        self.buffer.record_draws(snapshot.keys[rows])
        low, high = (int(w) for w in self.buffer.rng.draw("window", 2))
        config = dataclasses.replace(self.batching, seed=low | (high << 32))
        ids = snapshot.sample_ids
        plan = BatchPlanBuilder(snapshot.lengths[rows], config, sample_ids=[ids[r] for r in rows.tolist()],
                                tokenizer_hash=self.tokenizer_hash).build(1)
        epoch = plan.epochs[0]
        count = min(self.window_microbatches, len(epoch))
        microbatches: list[tuple[StreamSample, ...]] = []
        described: list[list[Any]] = []
        pack_sizes: list[tuple[int, ...]] = []
        for j in range(count):
            plan_rows = epoch.rows(j).tolist()
            samples = tuple(snapshot.samples[rows[r]] for r in plan_rows)
            microbatches.append(samples)
            described.append([[s.sample_id for s in samples], int(epoch.bucket_ids[j]), int(epoch.max_len[j])])
            if epoch.pack_rows is not None:
                sizes = plan.microbatch(0, j).pack_sizes
                assert sizes is not None  # a packed plan's microbatches have them
                pack_sizes.append(sizes)
                described[-1].append(list(pack_sizes[-1]))
        fingerprint = hashlib.sha256(canonical_json({"plan": plan.fingerprint, "microbatches": described})).hexdigest()
        window = Window(self.index, snapshot, rows, plan, tuple(microbatches), fingerprint, metrics,
                        time.perf_counter() - started, tuple(pack_sizes) if epoch.pack_rows is not None else None)
        if self.log is not None:
            self.log.append(self.record(window, added))
        self.index += 1
        return window

    def record(self, window: Window, added: list[tuple[int, StreamSample, float]]) -> dict[str, Any]:
        return {
            "window": window.index,
            "added": [{"key": key, "priority": priority, "sample": sample.to_dict()}
                      for key, sample, priority in added],
            "snapshot_fingerprint": window.snapshot.fingerprint,
            "plan_fingerprint": window.plan_fingerprint,
            "window_fingerprint": window.fingerprint,
            "microbatches": len(window.microbatches),
            "rng_offsets": self.buffer.rng.offsets,
            "metrics": window.metrics,
        }

    # -- checkpoints -------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The state a checkpoint stores (between windows only)."""
        if self.buffer.pending:
            raise failure(errors.REPLAY_BUFFER_INVALID,
                          f"{self.buffer.pending} samples were added since the last window and are not in the log "
                          "yet; checkpoint right after next_window()")
        return {"format": STATE_FORMAT, "windows": self.index, "buffer": self.buffer.state_dict(),
                "policy": None if self.policy is None else self.policy.state_dict()}

    @classmethod
    def resume(cls, state: Any, log: Any) -> RollingBatchPlanWindow:
        """The builder of a checkpoint: the log is cut back to the checkpoint's
        windows, the buffer refilled from the samples it records, the policies'
        state put back; new windows append to the same log."""
        state = check_window_state(state)
        path = log_path(log)
        contents = read_log(path, drop_torn_tail=True, max_windows=state["windows"])
        if len(contents.windows) < state["windows"]:
            raise failure(errors.WINDOW_LOG_INVALID, f"{path} holds {len(contents.windows)} windows; the checkpoint "
                                                     f"covers {state['windows']}")
        truncate_log(path, state["windows"])
        builder = cls.from_header(contents.header, log=WindowLog(path), where=f"{path}:1")
        needed = builder.buffer.keys_needed(state["buffer"])
        samples = {entry["key"]: StreamSample.from_dict(entry["sample"])
                   for record in contents.windows for entry in record["added"] if entry["key"] in needed}
        builder.buffer.load_state_dict(state["buffer"], samples)
        if builder.policy is not None:
            builder.policy.load_state_dict(state["policy"])
        elif state["policy"] is not None:
            raise failure(errors.SAMPLING_POLICY_INVALID, "the checkpoint has a policy state; the log has no policies")
        builder.index = state["windows"]
        return builder


def check_window_state(state: Any) -> dict[str, Any]:
    """``state`` if it has the layout of :meth:`RollingBatchPlanWindow.state_dict`."""
    keys = "a window state has exactly format, windows, buffer and policy"
    return checks.record(state, _WINDOW_STATE, fail=partial(failure, errors.REPLAY_BUFFER_INVALID), not_a_map=keys,
                         unknown=keys, missing=keys)


def _buffer_state(value: Any, name: str, *, fail: checks.Fail) -> Any:
    """The ``buffer`` of a window state: the replay buffer checks its own state."""
    check_state(value)
    return value


#: The layout of :meth:`RollingBatchPlanWindow.state_dict`, in the order its fields are checked.
_WINDOW_STATE = {
    "format": checks.field(checks.equal, STATE_FORMAT, message="window state format {value!r} is not {expected!r}"),
    "windows": checks.field(checks.integer, 0, None, strict=True,
                            message="window state '{name}' must be a non-negative integer"),
    "buffer": checks.field(_buffer_state),
    "policy": checks.nullable(checks.field(checks.instance, Mapping,
                                           message="window state '{name}' must be a map or null")),
}
