"""The token sources as artifacts (``umlos_cuda.artifacts``): a token store, a sharded token store and a
Megatron-LM pair, for ``umlos-cuda info`` and ``umlos-cuda verify``.

What goes in: a store folder (recognised by its marker or, written before markers, by its meta.json), a
sharded store folder (its marker), or the prefix of a Megatron pair (``PREFIX``, ``PREFIX.idx`` or
``PREFIX.bin`` whose ``.idx`` exists). What comes out: their registrations. ``verify`` is what ``data verify``
runs (the store's digests, vocabulary and loss mask values; a sharded store's shards, row digests and
logical dataset hash; a Megatron pair's pointers and token ids); ``report`` reads the headers alone.
"""

from __future__ import annotations

import os

from ...artifacts import Artifact, register_artifact
from .adopt import SHARDED_STORE
from .logical import ShardedTokenStore
from .megatron import MegatronDataset, idx_path
from .sources import megatron_prefix
from .store import TokenStore
from .writer import STORE


def _store_report(folder) -> dict:
    store = TokenStore.open(folder)
    return {"path": str(folder), "kind": STORE.name, "samples": len(store), "tokens": store.num_tokens,
            "token_dtype": store.meta["token_dtype"], "vocab_size": store.vocab_size,
            "loss_mask": store.meta["loss_mask"], "tokenizer_hash": store.tokenizer_hash,
            "dataset_hash": store.dataset_hash}


def _sharded_report(folder) -> dict:
    store = ShardedTokenStore.open(folder)
    return {"path": str(folder), "kind": SHARDED_STORE.name, "samples": len(store), "tokens": store.num_tokens,
            "shards": store.num_parts, "token_dtype": store.meta["token_dtype"], "vocab_size": store.vocab_size,
            "tokenizer_hash": store.tokenizer_hash, "dataset_hash": store.dataset_hash}


def _megatron_report(prefix) -> dict:
    dataset = MegatronDataset.open(megatron_prefix(os.fspath(prefix)))
    return {"path": dataset.prefix, "kind": "Megatron pair", "samples": len(dataset), "tokens": dataset.num_tokens,
            "documents": max(int(dataset.document_indices.shape[0]) - 1, 0), "token_dtype": str(dataset.dtype)}


def _lines(report: dict) -> list[str]:
    """One line of counts, then each other field."""
    counts = ", ".join(f"{report[key]} {key}" for key in ("samples", "tokens", "shards", "documents") if key in report)
    out = [f"{report['kind']} {report['path']}: {counts}"]
    out += [f"  {key} {report[key]}" for key in ("token_dtype", "vocab_size", "loss_mask", "tokenizer_hash",
                                                 "dataset_hash") if key in report]
    return out


def _verifier(opener):
    """``verify`` for a source ``opener`` opens: its own ``verify`` (module docstring), in words."""
    def verify(path) -> dict:
        source = opener(path)
        done = source.verify()
        what = {"shards": f" in {done['shards']} shards"} if "shards" in done else {}
        return {"fingerprint": getattr(source, "dataset_hash", None),
                "checks": [f"{done['samples']} samples{what.get('shards', '')}, {done['tokens']} tokens: digests, "
                           f"token ids and loss masks hold (tokenizer {done['tokenizer_hash']})"]}
    return verify


def _megatron(path) -> MegatronDataset:
    return MegatronDataset.open(megatron_prefix(os.fspath(path)))


def _is_megatron_prefix(path: str) -> bool:
    return not os.path.isdir(path) and os.path.lexists(idx_path(megatron_prefix(path)))


TOKEN_STORE = register_artifact(Artifact(STORE.name, open=TokenStore.open, verify=_verifier(TokenStore.open),
                                         report=_store_report, lines=_lines, folder=STORE), replace=True)
SHARDED_TOKEN_STORE = register_artifact(Artifact(SHARDED_STORE.name, open=ShardedTokenStore.open,
                                                 verify=_verifier(ShardedTokenStore.open), report=_sharded_report,
                                                 lines=_lines, folder=SHARDED_STORE), replace=True)
MEGATRON_PAIR = register_artifact(Artifact("Megatron pair", open=_megatron, verify=_verifier(_megatron),
                                           report=_megatron_report, lines=_lines, recognise=_is_megatron_prefix),
                                  replace=True)
