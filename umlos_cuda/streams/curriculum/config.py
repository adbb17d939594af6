"""``policy.yaml``: a list of sampling policies, validated strictly.

The format::

    policies:
      - type: difficulty_bucket
        weights: {easy: 0.2, medium: 0.5, hard: 0.3}
      - type: failure_replay
        failure_weight: 2.0
      - type: novelty
        novelty_window: 1000
      - type: length_quota
        quotas: {128: 0.1, 256: 0.2, 512: 0.4, 1024: 0.3}

The file is read by files/reader.py (a regular file of at most 1 MiB) and
parsed with the project's strict YAML loader (duplicate keys, alias bombs and
nesting past 64 levels refused). An unknown top-level key, policy type or policy key is
``SAMPLING_POLICY_INVALID`` naming it and what is allowed; a value of the
wrong type or range likewise. :func:`load_policies` returns a
:class:`~.policies.ComposedPolicy`; :func:`policies_from_data` does the same
for the parsed data (window logs store it, as JSON, with length quota edges
written as text).
"""

from __future__ import annotations

import os
from typing import Any

import yaml

from ... import checks, errors
from ...files import reader
from ...manifest import yaml_safe
from ..failures import failure
from .policies import ComposedPolicy, DifficultyBucketPolicy, FailureReplayPolicy, LengthQuotaPolicy, NoveltyPolicy

#: Each policy type, its class and the keys it takes besides ``type``.
POLICY_TYPES = {
    "difficulty_bucket": (DifficultyBucketPolicy, ("weights",)),
    "failure_replay": (FailureReplayPolicy, ("failure_weight",)),
    "novelty": (NoveltyPolicy, ("novelty_window",)),
    "length_quota": (LengthQuotaPolicy, ("quotas",)),
}
MAX_POLICY_BYTES = 1 << 20


def load_policies(path: str | os.PathLike[str]) -> ComposedPolicy:
    """The policies of a ``policy.yaml`` file."""
    path = os.fspath(path)
    try:
        text = reader.read_text(path, _invalid, max_bytes=MAX_POLICY_BYTES, what="policy file")
    except FileNotFoundError:
        raise _invalid(f"cannot read {path}: it does not exist") from None
    return policies_from_yaml(text, where=path)


def policies_from_yaml(text: str, where: str = "policy.yaml") -> ComposedPolicy:
    try:
        data = yaml_safe.load(text)
    except yaml.YAMLError as exc:
        raise _invalid(f"{where} is not valid YAML: {exc}") from None
    return policies_from_data(data, where)


#: The one key of a policy file.
_POLICY_FILE = {"policies": checks.field(checks.instance, list, empty=False,
                                         message="'policies' must be a non-empty list")}


def policies_from_data(data: Any, where: str = "policy.yaml") -> ComposedPolicy:
    data = checks.record(data, _POLICY_FILE, fail=lambda message: _invalid(f"{where}: {message}"),
                         not_a_map="must be a mapping with the key 'policies', got {type}",
                         unknown="unknown key {unknown}; the only key is 'policies'",
                         missing="'policies' must be a non-empty list")
    return ComposedPolicy([_policy(entry, f"{where}: policies[{i}]") for i, entry in enumerate(data["policies"])])


def _policy(entry: Any, where: str):
    """One entry of ``policies``: its type, exactly that type's keys, and the policy they make."""
    untyped = "{name} must be a mapping with a 'type'"
    if "type" not in checks.instance(entry, where, dict, fail=_invalid, message=untyped):
        raise _invalid(untyped.format(name=where))
    kind = checks.choice(entry["type"], where, POLICY_TYPES, fail=_invalid,
                         message="{name} has unknown type {value!r}; types: {choices}")
    cls, keys = POLICY_TYPES[kind]
    where = f"{where} ({kind})"
    arguments = checks.record({k: v for k, v in entry.items() if k != "type"}, dict.fromkeys(keys, _ANY),
                              fail=lambda message: _invalid(f"{where} {message}"),
                              unknown="has unknown key {unknown}; its keys: {fields}", missing="lacks {missing}")
    if kind == "length_quota" and isinstance(arguments["quotas"], dict):
        arguments["quotas"] = _edges(arguments["quotas"], where)
    try:
        return cls(**arguments)
    except errors.UmlosError as exc:
        raise _invalid(f"{where}: {exc.message}") from None


#: A policy's arguments are checked by the policy's class.
_ANY = checks.field(checks.anything)


def _edges(quotas: dict, where: str) -> dict[int, Any]:
    """A length quota's edges as integers: an integer, or its text (window logs store them as JSON keys),
    read by ``checks.integer_text`` in its one spelling (``"0128"`` is not 128); two keys of one edge
    (``128`` and ``"128"``) are refused, not merged. The policy checks their range."""
    edges: dict[int, Any] = {}
    for key, value in quotas.items():
        edge = key if checks.is_integer(key, strict=True) else _edge_text(key, where)
        if edge in edges:
            raise _invalid(f"{where} quota edge {edge} is given twice")
        edges[edge] = value
    return edges


def _edge_text(key: Any, where: str) -> int:
    message = f"{where} quota edge {repr(key)[:200]} is not a positive integer"
    edge = checks.integer_text(key, "quota edge", None, None, fail=_invalid, message=checks.literal(message))
    if str(edge) != key:
        raise _invalid(message)
    return edge


def _invalid(message: str):
    return failure(errors.SAMPLING_POLICY_INVALID, message)
