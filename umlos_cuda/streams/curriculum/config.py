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

The file is read with the project's strict YAML loader (duplicate keys and
alias bombs refused). An unknown top-level key, policy type or policy key is
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

from ... import errors
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
        with open(path, encoding="utf-8") as handle:
            text = handle.read(MAX_POLICY_BYTES + 1)
    except (OSError, UnicodeDecodeError) as exc:
        raise _invalid(f"cannot read {path}: {exc}") from None
    if len(text) > MAX_POLICY_BYTES:
        raise _invalid(f"{path} is over {MAX_POLICY_BYTES} bytes")
    return policies_from_yaml(text, where=path)


def policies_from_yaml(text: str, where: str = "policy.yaml") -> ComposedPolicy:
    try:
        data = yaml_safe.load(text)
    except yaml.YAMLError as exc:
        raise _invalid(f"{where} is not valid YAML: {exc}") from None
    return policies_from_data(data, where)


def policies_from_data(data: Any, where: str = "policy.yaml") -> ComposedPolicy:
    if not isinstance(data, dict):
        raise _invalid(f"{where} must be a mapping with the key 'policies', got {type(data).__name__}")
    unknown = sorted(str(k) for k in data if k != "policies")
    if unknown:
        raise _invalid(f"{where}: unknown key {', '.join(unknown)}; the only key is 'policies'")
    entries = data.get("policies")
    if not isinstance(entries, list) or not entries:
        raise _invalid(f"{where}: 'policies' must be a non-empty list")
    policies = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or "type" not in entry:
            raise _invalid(f"{where}: policies[{i}] must be a mapping with a 'type'")
        kind = entry["type"]
        if kind not in POLICY_TYPES:
            raise _invalid(f"{where}: policies[{i}] has unknown type {kind!r}; types: {', '.join(POLICY_TYPES)}")
        cls, keys = POLICY_TYPES[kind]
        extra = sorted(str(k) for k in entry if k != "type" and k not in keys)
        if extra:
            raise _invalid(f"{where}: policies[{i}] ({kind}) has unknown key {', '.join(extra)}; "
                           f"its keys: {', '.join(keys)}")
        missing = [k for k in keys if k not in entry]
        if missing:
            raise _invalid(f"{where}: policies[{i}] ({kind}) lacks {', '.join(missing)}")
        arguments = {k: entry[k] for k in keys}
        if kind == "length_quota" and isinstance(arguments["quotas"], dict):
            arguments["quotas"] = {_edge(k, where, i): v for k, v in arguments["quotas"].items()}
        try:
            policies.append(cls(**arguments))
        except errors.UmlosError as exc:
            raise _invalid(f"{where}: policies[{i}] ({kind}): {exc.message}") from None
    return ComposedPolicy(policies)


def _edge(key: Any, where: str, i: int) -> int:
    if isinstance(key, str) and key.isdigit():
        return int(key)
    if isinstance(key, int) and not isinstance(key, bool):
        return key
    raise _invalid(f"{where}: policies[{i}] (length_quota) quota edge {key!r} is not a positive integer")


def _invalid(message: str):
    return failure(errors.SAMPLING_POLICY_INVALID, message)
