"""Golden traces of NextBatch_v2 (docs/spec/README.md, "The golden file"): load, recompute, compare.

``golden/nextbatch_v2.json`` (shipped inside the package; :mod:`..bundled`) is
self-describing: it holds the manifests it uses, and every case holds its
inputs and the expected outputs. Verifying recomputes each case on a backend
and compares field by field; nothing is ever regenerated here (the generator
is ``golden/make_nextbatch_golden.py``, which calls :func:`compute_case`).

Byte encoding (normative for every ``sha256`` field): the indices, in the
order they are emitted, each as a uint64 little-endian (8 bytes), concatenated;
the digest is SHA-256, lowercase hex. ``data_replay_t_sha256`` is the SHA-256
of the 32-byte ``data_replay_t`` values of the calls, concatenated in call
order.

Case kinds:

``manifest``
    ``manifest_hash`` and ``replay_token`` of one manifest (R3).
``epoch_run``
    ``next_batch`` from ``(epoch, 0)`` until the cursor leaves the epoch, every
    rank of ``world_size`` in rank order at each step: step count, total count,
    SHA-256, first and last 64 indices, final cursor, R9 metadata.
``window``
    ``epoch_indices(start, count)`` of a train epoch: SHA-256, first and last 8.
``positions``
    single train positions of an epoch, verbatim.
``batch``
    one ``next_batch`` step at a given cursor, every rank: per-rank count and
    SHA-256, the cursor after, R9 metadata.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import checks, errors
from ..backends import to_numpy
from ..bundled import bundled_folder
from ..cursor import Cursor
from ..errors import UmlosError
from ..files import reader
from ..manifest.core import Manifest
from ..nextbatch import epoch_indices, next_batch

GOLDEN_NAME = "nextbatch_v2.json"
FORMAT = "umlos-cuda/nextbatch-v2-golden"
FORMAT_VERSION = 1

#: ``progress(done, total, case_id, passed)`` after each case.
ProgressCallback = Callable[[int, int, str, bool], None]


def _mismatch(message: str) -> UmlosError:
    """GOLDEN_MISMATCH, the one code of this module, with its operator."""
    return UmlosError(errors.GOLDEN_MISMATCH, message, operator=errors.GOLDEN_OPERATOR)


def index_bytes(indices) -> bytes:
    """The golden byte encoding of an index array: uint64 little-endian."""
    return np.ascontiguousarray(to_numpy(indices), dtype="<u8").tobytes()


def load_golden(path: str | None = None) -> dict[str, Any]:
    """The parsed golden file: the packaged one, or ``path``."""
    where = path or f"golden/{GOLDEN_NAME}"
    try:
        if path is None:
            document = json.loads(bundled_folder("golden").joinpath(GOLDEN_NAME).read_text(encoding="utf-8"))
        else:  # a file given on the command line: a regular file, bounded in size and depth
            document = reader.read_json(path, lambda message: _mismatch(f"cannot read the golden file: {message}"))
    except (OSError, ValueError) as exc:
        raise _mismatch(f"cannot read the golden file {where}: {exc}") from exc
    not_golden = checks.literal(f"not a NextBatch_v2 golden file (format must be {FORMAT!r})")
    checks.instance(document, "golden file", dict, fail=_mismatch, message=not_golden)
    checks.equal(document.get("format"), "format", FORMAT, fail=_mismatch, message=not_golden)
    if document.get("format_version") != FORMAT_VERSION:
        raise _mismatch(f"golden format_version {document.get('format_version')!r} is not the supported "
                        f"{FORMAT_VERSION}")
    return document


# --------------------------------------------------------------------- compute
def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _ints(array) -> list[int]:
    return [int(x) for x in to_numpy(array).tolist()]


def _manifest(inputs: Mapping[str, Any], manifests: Mapping[str, Manifest]) -> Manifest:
    name = inputs["manifest"]
    if name not in manifests:
        raise _mismatch(f"case names manifest {name!r}, which the golden file lacks")
    return manifests[name]


def _compute_manifest(inputs, manifests, backend):
    manifest = _manifest(inputs, manifests)
    return {"manifest_hash": manifest.hash.hex(), "replay_token": manifest.replay_token.hex()}


def _compute_epoch_run(inputs, manifests, backend):
    manifest = _manifest(inputs, manifests)
    world_size = inputs["world_size"]
    epoch = inputs["epoch"]
    digest, replay = hashlib.sha256(), hashlib.sha256()
    cursor = Cursor(epoch, 0)
    steps = count = 0
    head: list[int] = []
    tail = np.empty(0, dtype=np.uint64)
    metadata = None
    while cursor.epoch == epoch:
        after = None
        for rank in range(world_size):
            batch = next_batch(manifest, inputs["dataset"], world_size, rank, inputs["stage"], cursor,
                               backend=backend, preset=inputs.get("preset"))
            indices = to_numpy(batch.indices)
            digest.update(index_bytes(indices))
            replay.update(bytes.fromhex(batch.metadata["data_replay_t"]))
            count += len(indices)
            if len(head) < 64:
                head.extend(_ints(indices[: 64 - len(head)]))
            tail = np.concatenate([tail, indices])[-64:]
            metadata = metadata or batch.metadata
            if after is not None and batch.cursor != after:
                raise _mismatch(f"ranks disagree on the cursor after step {steps}")
            after = batch.cursor
        assert after is not None  # world_size >= 1: some rank ran
        cursor = after
        steps += 1
    assert metadata is not None  # the epoch has a first step
    return {
        "steps": steps,
        "count": count,
        "sha256": digest.hexdigest(),
        "first_64": head,
        "last_64": _ints(tail),
        "final_cursor": cursor.to_dict(),
        "sampling_mode": metadata["sampling_mode"],
        "sampler_config_hash": metadata["sampler_config_hash"],
        "data_replay_t_sha256": replay.hexdigest(),
    }


def _compute_window(inputs, manifests, backend):
    indices = epoch_indices(_manifest(inputs, manifests), inputs["dataset"], epoch=inputs["epoch"],
                            start=inputs["start"], count=inputs["count"], backend=backend)
    indices = to_numpy(indices)
    return {"sha256": _sha(index_bytes(indices)), "first_8": _ints(indices[:8]), "last_8": _ints(indices[-8:])}


def _compute_positions(inputs, manifests, backend):
    manifest = _manifest(inputs, manifests)
    found = []
    for position in inputs["positions"]:
        one = epoch_indices(manifest, inputs["dataset"], epoch=inputs["epoch"], start=position, count=1,
                            backend=backend)
        found.extend(_ints(one))
    return {"indices": found}


def _compute_batch(inputs, manifests, backend):
    manifest = _manifest(inputs, manifests)
    world_size = inputs["world_size"]
    cursor = Cursor.from_dict(inputs["cursor"])
    ranks, replay, whole = [], hashlib.sha256(), hashlib.sha256()
    after = metadata = None
    for rank in range(world_size):
        batch = next_batch(manifest, inputs["dataset"], world_size, rank, inputs["stage"], cursor,
                           backend=backend, preset=inputs.get("preset"))
        data = index_bytes(batch.indices)
        whole.update(data)
        replay.update(bytes.fromhex(batch.metadata["data_replay_t"]))
        ranks.append({"count": len(data) // 8, "sha256": _sha(data)})
        after, metadata = batch.cursor, batch.metadata
    assert after is not None and metadata is not None  # world_size >= 1: some rank ran
    return {
        "ranks": ranks,
        "sha256": whole.hexdigest(),
        "cursor_after": after.to_dict(),
        "sampling_mode": metadata["sampling_mode"],
        "sampler_config_hash": metadata["sampler_config_hash"],
        "data_replay_t_sha256": replay.hexdigest(),
    }


_KINDS = {
    "manifest": _compute_manifest,
    "epoch_run": _compute_epoch_run,
    "window": _compute_window,
    "positions": _compute_positions,
    "batch": _compute_batch,
}


def build_manifests(document: Mapping[str, Any]) -> dict[str, Manifest]:
    """The golden file's manifests, validated and hashed."""
    return {name: Manifest.from_dict(raw) for name, raw in document["manifests"].items()}


def compute_case(case: Mapping[str, Any], manifests: Mapping[str, Manifest], backend: str = "auto") -> dict[str, Any]:
    """Recompute a case's ``expected`` block from its ``kind`` and ``input``."""
    kind = case.get("kind")
    if kind not in _KINDS:
        raise _mismatch(f"unknown golden case kind {kind!r}; known: {', '.join(_KINDS)}")
    return _KINDS[kind](case["input"], manifests, backend)


# --------------------------------------------------------------------- verify
@dataclass
class CaseResult:
    id: str
    kind: str
    passed: bool
    mismatches: list[str] = field(default_factory=list)


@dataclass
class GoldenReport:
    backend: str
    results: list[CaseResult]

    @property
    def ok(self) -> bool:
        return bool(self.results) and all(result.passed for result in self.results)

    @property
    def failures(self) -> list[CaseResult]:
        return [result for result in self.results if not result.passed]

    def summary(self) -> str:
        passing = len(self.results) - len(self.failures)
        return f"{passing}/{len(self.results)} golden cases pass on backend {self.backend}"

    def raise_for_failures(self) -> None:
        """Raise ``UmlosError(GOLDEN_MISMATCH)`` naming the failed cases, if any."""
        if not self.results:
            raise _mismatch("no golden case was verified")
        if self.failures:
            names = ", ".join(result.id for result in self.failures[:10])
            more = f" and {len(self.failures) - 10} more" if len(self.failures) > 10 else ""
            raise _mismatch(f"{self.summary()}; failed: {names}{more}")


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 80 else text[:77] + "..."


def compare(expected: Mapping[str, Any], actual: Mapping[str, Any]) -> list[str]:
    """Field-by-field differences, one line each ("" when equal)."""
    lines = []
    for name in sorted(set(expected) | set(actual)):
        if expected.get(name) != actual.get(name):
            lines.append(f"{name}: expected {_short(expected.get(name))}, got {_short(actual.get(name))}")
    return lines


def verify(
    path: str | None = None,
    backend: str = "auto",
    progress: ProgressCallback | None = None,
    only: Iterable[str] | str | None = None,
) -> GoldenReport:
    """Recompute every case (or those whose id contains one of ``only``) and compare.

    Returns a :class:`GoldenReport`; call ``raise_for_failures()`` to turn a
    mismatch into ``UmlosError(GOLDEN_MISMATCH)``. A case that raises counts
    as failed with the error as its mismatch.
    """
    from ..backends import get_backend

    engine_name = get_backend(backend).name  # BACKEND_UNAVAILABLE before any work
    document = load_golden(path)
    manifests = build_manifests(document)
    if isinstance(only, str):
        only = [only]
    cases = [case for case in document["cases"] if only is None or any(part in case["id"] for part in only)]
    results = []
    for done, case in enumerate(cases, 1):
        try:
            mismatches = compare(case["expected"], compute_case(case, manifests, engine_name))
        except UmlosError as exc:
            mismatches = [f"raised {exc.code}: {exc.message}"]
        result = CaseResult(case["id"], case["kind"], not mismatches, mismatches)
        results.append(result)
        if progress is not None:
            progress(done, len(cases), result.id, result.passed)
    return GoldenReport(engine_name, results)
