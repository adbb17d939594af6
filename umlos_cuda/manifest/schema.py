"""The keys a manifest may hold, and the refusal of every other key.

A key the engine does not know is almost always a typo (``sead: 42``,
``droplast: true``), and a typo that is silently accepted runs with the
default instead: seed 0, ``drop_last`` false, the default block size, with
nothing to tell the user. So every mapping of a manifest has a fixed set of
keys, except the three that hold the user's own data: ``policy`` and ``env``
(hashed into the replay token, R3) and ``extra`` (hashed into
``manifest_hash`` only). docs/manifest.md describes each key; a test checks
that it lists exactly the keys below.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from .. import checks, errors
from ..errors import UmlosError

#: Where every key is described; manifest errors end by pointing there.
DOCS = "docs/manifest.md"

#: Top-level keys. ``policy``, ``env`` and ``extra`` are free-form mappings.
TOP_LEVEL_KEYS = ("spec_version", "seed", "global_batch_size", "data", "datasets", "policy", "env", "extra")
#: Keys of ``data``.
DATA_KEYS = ("sampler_block_size", "drop_last", "sampling_mode")
#: Keys of each ``datasets.KEY`` entry (all four mandatory; docs/manifest.md).
DATASET_KEYS = ("id", "version", "hash", "cardinality")
#: Optional keys of a dataset entry: its split (docs/manifest.md, "The dataset list"), read by the probe set.
DATASET_OPTIONAL_KEYS = ("split",)
#: The values of ``split``.
SPLITS = ("train", "val")
#: The top-level keys whose content is the user's and is not checked key by key.
FREE_FORM_KEYS = ("policy", "env", "extra")

#: Every key as a dotted path, for suggestions across levels
#: (``droplast`` at the top level: "did you mean 'data.drop_last'?").
ALL_PATHS = (
    TOP_LEVEL_KEYS
    + tuple(f"data.{name}" for name in DATA_KEYS)
    + tuple(f"datasets.<KEY>.{name}" for name in DATASET_KEYS + DATASET_OPTIONAL_KEYS)
)


#: A key whose value the manifest's own checks read (checks.record checks only that the key is allowed).
ANY = checks.field(checks.anything)


def invalid_manifest(message: str) -> UmlosError:
    """INVALID_MANIFEST, its record naming manifest validation (UML_OS.Data.ValidateManifest_v1);
    a NextBatch call that validates a manifest names itself instead (docs/errors.md)."""
    return UmlosError(errors.INVALID_MANIFEST, message, operator=errors.MANIFEST_OPERATOR)


def nearest_key(key: str, allowed: Iterable[str]) -> str | None:
    """The allowed key (or dotted path) closest to ``key``, or None when none is close.

    Keys at the same level are tried first, then every key of the manifest by
    its last name, so a key written at the wrong level is found too.
    """
    same_level = difflib.get_close_matches(key, list(allowed), n=1)
    if same_level:
        return same_level[0]
    by_leaf = {path.rsplit(".", 1)[-1]: path for path in ALL_PATHS}
    match = difflib.get_close_matches(key, list(by_leaf), n=1)
    return by_leaf[match[0]] if match else None


def unknown_keys(allowed: tuple[str, ...], where: str) -> Callable[[dict[str, Any]], str]:
    """How :func:`umlos_cuda.checks.record` words keys outside ``allowed`` in ``where``:
    the first unknown key (in sorted order) and how many more, the nearest allowed
    key, and what is allowed."""
    def words(keys: dict[str, Any]) -> str:
        unknown = keys["unknown_list"]
        key = unknown[0]
        path = key if where == "manifest" else f"{where}.{key}"
        parts = [f"unknown key {path!r}" + (f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else "")]
        suggestion = nearest_key(key, allowed)
        if suggestion in allowed and where != "manifest":
            suggestion = f"{where}.{suggestion}"
        if suggestion:
            parts[0] += f" (did you mean {suggestion!r}?)"
        place = "at the top level" if where == "manifest" else f"in {where}"
        parts.append(f"allowed {place}: {', '.join(allowed)}")
        if where == "manifest":
            parts.append("put your own fields under 'extra'")
        return "; ".join(parts)
    return words


def refuse_unknown_keys(mapping: Mapping[str, object], allowed: tuple[str, ...], where: str) -> None:
    """Raise ``INVALID_MANIFEST`` naming the first unknown key of ``mapping`` (:func:`unknown_keys`)."""
    checks.record(mapping, {}, optional=dict.fromkeys(allowed, ANY), fail=invalid_manifest,
                  unknown=unknown_keys(allowed, where))
