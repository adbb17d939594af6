"""Length caches as artifacts (``umlos_cuda.artifacts``): the JSONL and its ``.u32`` sidecar, for ``umlos-cuda
info`` and ``umlos-cuda verify``.

What goes in: a file (a file holds no marker: a cache is recognised by its first row, a sidecar by its name and
magic bytes). What comes out: their registrations. ``verify`` of a cache reads every row and, when its sidecar
is there, checks the sidecar against the rows one by one (``LengthCache.load(sidecar="require")``); of a sidecar
alone, hashes its length bytes against the SHA-256 in its header. ``report`` gives the counts, the
tokenizer and dataset hashes and the spread of the lengths.
"""

from __future__ import annotations

import os

import numpy as np

from ...artifacts import Artifact, register_artifact
from ...files.artifacts import read_head
from .cache import LENGTH_CACHE, SIDECAR_MAGIC, SIDECAR_SUFFIX, LengthCache, sidecar_path
from .sources import MappedLengths, open_sidecar


def _spread(lengths) -> dict:
    values = np.asarray(lengths, dtype=np.int64)
    if not values.size:
        return {"min": 0, "median": 0, "max": 0, "mean": 0.0}
    return {"min": int(values.min()), "median": int(np.median(values)), "max": int(values.max()),
            "mean": round(float(values.mean()), 3)}


def _load(path) -> LengthCache:
    path = os.fspath(path)
    return LengthCache.load(path, sidecar="require" if os.path.exists(sidecar_path(path)) else "ignore")


def _cache_report(path) -> dict:
    cache = _load(path)
    return {"path": os.fspath(path), "kind": LENGTH_CACHE.name, "samples": len(cache),
            "sidecar": os.path.exists(sidecar_path(os.fspath(path))), "tokenizer_hash": cache.tokenizer_hash,
            "dataset_hash": cache.dataset_hash, "lengths": _spread(cache.lengths)}


def _sidecar_report(path) -> dict:
    source = MappedLengths(os.fspath(path))
    return {"path": os.fspath(path), "kind": SIDECAR_KIND, "samples": source.count,
            "tokenizer_hash": source.tokenizer_hash, "lengths_sha256": source.binding()["lengths_sha256"]}


def _lines(report: dict) -> list[str]:
    out = [f"{report['kind']} {report['path']}: {report['samples']} samples"]
    if "lengths" in report:
        spread = report["lengths"]
        out.append(f"  lengths {spread['min']} to {spread['max']}, median {spread['median']}, mean {spread['mean']}")
    out += [f"  {key} {report[key]}" for key in ("sidecar", "tokenizer_hash", "dataset_hash", "lengths_sha256")
            if key in report]
    return out


def _verify_cache(path) -> dict:
    cache = _load(path)
    against = " and its .u32 sidecar agrees row by row" if os.path.exists(sidecar_path(os.fspath(path))) else ""
    return {"fingerprint": cache.dataset_hash, "checks": [f"{len(cache)} rows read{against}"]}


def _verify_sidecar(path) -> dict:
    source = open_sidecar(os.fspath(path))
    return {"fingerprint": source.binding()["lengths_sha256"],
            "checks": [f"{source.count} lengths hash to the SHA-256 in the header"]}


def _is_sidecar(path: str) -> bool:
    return path.endswith(SIDECAR_SUFFIX) and read_head(path, len(SIDECAR_MAGIC)) == SIDECAR_MAGIC


SIDECAR_KIND = "length cache sidecar"
CACHE = register_artifact(Artifact(LENGTH_CACHE.name, open=_load, verify=_verify_cache, report=_cache_report,
                                   lines=_lines, recognise=LENGTH_CACHE.recognise), replace=True)
SIDECAR = register_artifact(Artifact(SIDECAR_KIND, open=open_sidecar, verify=_verify_sidecar, report=_sidecar_report,
                                     lines=_lines, recognise=_is_sidecar), replace=True)
