"""The manifest's ``datasets``: a map, or the UML_OS kernel's list, canonicalised to the map.

Manifests have always named their datasets in a map,
``datasets: {KEY: {id, version, hash, cardinality}}``, and the NextBatch
calls take the ``KEY``. The v3.8 kernel's manifest lists them instead
(docs/manifest.md, "The dataset list"), each entry with its ``split``, ``train`` or ``val``::

    datasets:
      - {id: corpus, version: "3", hash: "sha256:...", split: train, cardinality: 1000000}
      - {id: corpus-val, version: "3", hash: "sha256:...", split: val, cardinality: 5000}

Both are accepted. A list becomes the map whose keys are the entries'
splits (``{"train": {...}, "val": {...}}``) before anything is validated or
hashed, so a list and the map it stands for are the same manifest with the
same ``manifest_hash``, and every map manifest written before the list
existed hashes as it did. A map entry may state its ``split`` too, which the
functional probe set reads (``umlos_cuda.rng.probes``). Two list entries with
the same split have no key to tell them apart: that needs the map.
"""

from __future__ import annotations

from typing import Any

from .. import checks
from .schema import SPLITS, invalid_manifest


def datasets_as_map(datasets: Any) -> Any:
    """``datasets`` as the map it stands for (a list is keyed by split); other values unchanged."""
    if not isinstance(datasets, list):
        return datasets
    out: dict[str, Any] = {}
    for index, entry in enumerate(datasets):
        where = f"datasets[{index}]"
        checks.instance(entry, where, dict, fail=invalid_manifest,
                        message="{name} must be a mapping {{id, version, hash, split, cardinality}}, got {type}")
        if "split" not in entry:
            raise invalid_manifest(f"{where} lacks split: in the list form each dataset declares its split "
                                   f"({' or '.join(SPLITS)}), which becomes its key")
        split = check_split(entry["split"], f"{where}.split")
        if split in out:
            raise invalid_manifest(f"{where} is a second dataset with split {split!r}; the list form has one dataset "
                                   "per split (name them in the map form, datasets: {KEY: {...}}, to have more)")
        out[split] = entry
    return out


def check_split(value: Any, where: str) -> str:
    """``value`` if it is one of :data:`SPLITS`, else ``INVALID_MANIFEST`` naming them."""
    return checks.choice(value, where, SPLITS, fail=invalid_manifest)
