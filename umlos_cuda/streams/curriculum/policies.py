"""Curriculum sampling policies: which buffer samples a window trains on.

A :class:`SamplingPolicy` turns per-sample weights into new weights over a
:class:`~..buffer.snapshot.BufferSnapshot`; :class:`ComposedPolicy` applies a list
of them and draws. Definitions (``w`` the weights so far, starting at the
samples' priorities):

- ``DifficultyBucketPolicy(weights)``: the draws fall into difficulty ``d``
  with probability ``weights[d]`` normalised over the difficulties present
  (and drawable); within ``d`` in proportion to ``w``. Samples of a
  difficulty not named get weight 0.
- ``FailureReplayPolicy(failure_weight)``: ``w`` times ``failure_weight``
  for samples of unsolved episodes (``solved`` False).
- ``LengthQuotaPolicy(quotas)``: like the difficulty policy over length
  classes: a sample of length ``L`` is in the class of the smallest quota
  edge ``>= L``; longer than every edge, weight 0.
- ``NoveltyPolicy(novelty_window)``: a sample drawn in the last
  ``novelty_window`` draws is not drawn again while enough others remain;
  with it, a window draws without replacement (Efraimidis-Spirakis keys
  ``log(u) / w``, the largest win), fresh samples before recent ones, so a
  sample repeats within ``novelty_window`` draws only when fewer than ``n``
  fresh ones are drawable.

Stratifying policies (difficulty, length) are applied in the order listed;
the last one's shares hold exactly in expectation, an earlier one's only as
far as the later reweighting keeps them. Without a novelty policy the draws
are with replacement (inverse CDF of ``w``). Uniforms come from the buffer
RNG's ``policy`` sub-stream; novelty's recent draws are part of the state.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ... import checks, errors
from ..buffer.rng import BufferRng
from ..failures import failure
from ..buffer.replay_buffer import MAX_SIZE, inverse_cdf
from ..buffer.snapshot import BufferSnapshot
from ...errors import UINT32_MAX

#: The most draws a novelty policy remembers (kept in memory, and in its state): the largest buffer's size.
MAX_NOVELTY_WINDOW = MAX_SIZE


@runtime_checkable
class SamplingPolicy(Protocol):
    type: str

    def reweight(self, snapshot: BufferSnapshot, weights: np.ndarray) -> np.ndarray: ...

    def to_config(self) -> dict[str, Any]: ...


def _shares(values: Mapping[Any, float], what: str) -> dict[Any, float]:
    checks.instance(values, what, Mapping, empty=False, fail=_invalid, message="{name} must be a non-empty mapping")
    out = {}
    for key, value in values.items():
        out[key] = checks.number(value, f"{what}[{key!r}]", at_least=0, fail=_invalid,
                                 message="{name} must be a finite number >= 0, got {value!r}")
    if not sum(out.values()) > 0:
        raise _invalid(f"{what} must have a positive total")
    return out


def stratify(weights: np.ndarray, classes: np.ndarray, shares: Mapping[int, float], what: str) -> np.ndarray:
    """Reweight so that class ``c`` (rows with ``classes == c``) holds
    ``shares[c]`` of the total, normalised over the classes with weight;
    rows of class -1 get 0."""
    out = np.zeros_like(weights)
    present = {c: float(weights[classes == c].sum()) for c in shares}
    present = {c: total for c, total in present.items() if total > 0 and shares[c] > 0}
    if not present:
        raise _invalid(f"no sample of the buffer is in a {what} class with a positive share")
    norm = sum(shares[c] for c in present)
    for c, total in present.items():
        mask = classes == c
        out[mask] = weights[mask] * (shares[c] / norm / total)
    return out


class DifficultyBucketPolicy:
    type = "difficulty_bucket"

    def __init__(self, weights: Mapping[str, float]) -> None:
        self.weights = _shares(weights, "difficulty_bucket weights")
        for name in self.weights:
            checks.text(name, "difficulty_bucket weights", fail=_invalid,
                        message="{name} are keyed by difficulty name, got {value!r}")
        self._names = list(self.weights)

    def classes(self, snapshot: BufferSnapshot) -> np.ndarray:
        index = {name: i for i, name in enumerate(self._names)}
        return np.array([index.get(d, -1) for d in snapshot.difficulties], dtype=np.int64)

    def reweight(self, snapshot: BufferSnapshot, weights: np.ndarray) -> np.ndarray:
        shares = {i: self.weights[name] for i, name in enumerate(self._names)}
        return stratify(weights, self.classes(snapshot), shares, "difficulty")

    def to_config(self) -> dict[str, Any]:
        return {"type": self.type, "weights": dict(self.weights)}


class FailureReplayPolicy:
    type = "failure_replay"

    def __init__(self, failure_weight: float = 2.0) -> None:
        self.failure_weight = checks.number(failure_weight, "failure_weight", above=0, fail=_invalid,
                                            message="{name} must be a positive finite number, got {value!r}")

    def reweight(self, snapshot: BufferSnapshot, weights: np.ndarray) -> np.ndarray:
        return np.where(snapshot.solved == 0, weights * self.failure_weight, weights)

    def to_config(self) -> dict[str, Any]:
        return {"type": self.type, "failure_weight": self.failure_weight}


class LengthQuotaPolicy:
    type = "length_quota"

    def __init__(self, quotas: Mapping[int, float]) -> None:
        shares = _shares(quotas, "length_quota quotas")
        for edge in shares:  # a sample's length is at most 2^32 - 1: a longer edge is no length
            checks.integer(edge, "length_quota quotas", 1, UINT32_MAX, strict=True, fail=_invalid,
                           message="{name} are keyed by integer lengths in [1, 2^32 - 1], got {value!r}")
        self.edges = np.array(sorted(shares), dtype=np.int64)
        self.quotas = {int(e): shares[int(e)] for e in self.edges}

    def classes(self, snapshot: BufferSnapshot) -> np.ndarray:
        classes = np.searchsorted(self.edges, snapshot.lengths.astype(np.int64), side="left")
        return np.where(classes < self.edges.size, classes, -1)

    def reweight(self, snapshot: BufferSnapshot, weights: np.ndarray) -> np.ndarray:
        shares = {i: self.quotas[int(e)] for i, e in enumerate(self.edges)}
        return stratify(weights, self.classes(snapshot), shares, "length")

    def to_config(self) -> dict[str, Any]:
        return {"type": self.type, "quotas": {int(e): q for e, q in self.quotas.items()}}


class NoveltyPolicy:
    type = "novelty"

    def __init__(self, novelty_window: int = 1000) -> None:
        self.novelty_window = checks.integer(novelty_window, "novelty_window", 1, MAX_NOVELTY_WINDOW, fail=_invalid,
                                             message="{name} must be an integer in [1, 2^26] (the draws "
                                             "remembered: at most as many as the largest buffer holds), got {value!r}")
        self.recent: deque[int] = deque(maxlen=novelty_window)

    def reweight(self, snapshot: BufferSnapshot, weights: np.ndarray) -> np.ndarray:
        return weights

    def recent_mask(self, snapshot: BufferSnapshot) -> np.ndarray:
        recent = np.fromiter(self.recent, dtype=np.int64, count=len(self.recent))
        return np.isin(snapshot.keys, recent)

    def to_config(self) -> dict[str, Any]:
        return {"type": self.type, "novelty_window": self.novelty_window}

    def state_dict(self) -> dict[str, Any]:
        return {"recent": np.fromiter(self.recent, dtype="<i8", count=len(self.recent)).tobytes()}

    def load_state_dict(self, state: Any) -> None:
        wrong = "a novelty state is {{'recent': bytes of at most novelty_window int64 keys}}"
        fields = {"recent": checks.field(checks.instance, bytes, max_length=8 * self.novelty_window, message=wrong)}
        recent = checks.record(state, fields, fail=_invalid, not_a_map=wrong, unknown=wrong, missing=wrong)["recent"]
        if len(recent) % 8:
            raise _invalid(wrong.format())
        self.recent = deque(np.frombuffer(recent, dtype="<i8").tolist(), maxlen=self.novelty_window)


class ComposedPolicy:
    """Policies applied in order, then one draw of ``n`` samples (see the module docstring)."""

    def __init__(self, policies: Sequence[SamplingPolicy]) -> None:
        self.policies = list(policies)
        novelty = [p for p in self.policies if isinstance(p, NoveltyPolicy)]
        if len(novelty) > 1:
            raise _invalid("at most one novelty policy")
        self.novelty = novelty[0] if novelty else None

    def weights(self, snapshot: BufferSnapshot) -> np.ndarray:
        weights = snapshot.priorities.astype(np.float64).copy()
        for policy in self.policies:
            weights = policy.reweight(snapshot, weights)
        return weights

    def select(self, snapshot: BufferSnapshot, n: int, rng: BufferRng) -> np.ndarray:
        """Rows of ``snapshot`` for one window, in draw order."""
        if not len(snapshot):
            raise failure(errors.REPLAY_BUFFER_INVALID, "cannot select from an empty buffer")
        if self.novelty is None:
            return inverse_cdf(self.weights(snapshot), rng.uniforms("policy", n))
        weights = self.weights(snapshot)
        drawable = np.flatnonzero(weights > 0)
        if drawable.size == 0:
            raise failure(errors.REPLAY_BUFFER_INVALID, "every sample has weight 0: nothing can be drawn")
        u = rng.uniforms("policy", drawable.size)
        keys = np.log1p(-u) / weights[drawable]  # log(1 - u) in (-inf, 0]: the largest keys win
        recent = self.novelty.recent_mask(snapshot)[drawable]
        # fresh samples first (in key order), then, only if the buffer has too few, recent ones
        order = np.lexsort((-keys, recent))[:n]
        rows = drawable[order]
        if rows.size < n:  # fewer drawable samples than draws: cycle through them again
            rows = np.resize(rows, n)
        self.novelty.recent.extend(snapshot.keys[rows].tolist())
        return rows

    def to_config(self) -> list[dict[str, Any]]:
        return [p.to_config() for p in self.policies]

    def state_dict(self) -> dict[str, Any]:
        return {"novelty": None if self.novelty is None else self.novelty.state_dict()}

    def load_state_dict(self, state: Any) -> None:
        keys = "a policy state has exactly the key novelty"
        state = checks.record(state, {"novelty": checks.field(checks.anything)}, fail=_invalid, not_a_map=keys,
                              unknown=keys, missing=keys)
        if (state["novelty"] is None) != (self.novelty is None):
            raise _invalid("the saved policy state and this composition disagree on the novelty policy")
        if self.novelty is not None:
            self.novelty.load_state_dict(state["novelty"])


def _invalid(message: str):
    return failure(errors.SAMPLING_POLICY_INVALID, message)
