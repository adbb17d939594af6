"""LLM batching on top of the index engine (docs/batching.md).

The pipeline, one sub-package per stage, in the order data flows:

    samples, templates   :class:`Sample`, :class:`PreferenceSample`; the SFT template
    records/             training records: JSONL (plain, gzip, zstd), Parquet, Arrow, datasets, shards; fingerprint
    lengths/             length caches: JSONL reading, tokenizer loading, fingerprints, the builder, statistics
    chat/                chat records: the tokenizer's chat template, assistant loss masks; conversational
                         preference records rendered as TRL renders them
    packing/             sequence packing: :func:`pack_lengths`, :func:`pack_sequences`, packed rows, metrics
    plans/               token-budget batch plans: config, planner, builder, plan folders, verify, sharding
    tokens/              token stores (sharded too) and Megatron indexed datasets, as token sources
    collate              one microbatch to padded arrays; attention_mask: segment masks
    presets              a collated batch as a model takes it: shifted, hf, padding_free
    preference           preference pairs to chosen and rejected arrays, for DPO-style losses
    batches/             batch files: writer, reader, batch fingerprints

This package only re-exports the public names of those modules.
"""

from typing import TYPE_CHECKING

from ..reexports import lazy

if TYPE_CHECKING:  # the re-exports, imported on first use (umlos_cuda/reexports.py)
    from .attention_mask import create_segment_attention_mask
    from .batches.fingerprint import (BatchFingerprint, compute_batch_fingerprint, fingerprint_plan_batches,
                                      verify_batch_fingerprint)
    from .batches.reader import BatchReader
    from .batches.writer import BatchWriteReport, BatchWriter, write_batches
    from .plans.buckets import BucketSpec
    from .chat import ChatSample, encode_chat
    from .plans.builder import BatchPlanBuilder
    from .collate import CollatedBatch, collate_microbatch, default_collate
    from .presets import CollationPreset, apply_preset
    from .preference import PreferenceBatch, collate_preference, collate_preference_microbatch, split_pairs
    from .plans.config import BatchingConfig, PadPolicy
    from .lengths.fingerprints import dataset_fingerprint, tokenizer_fingerprint
    from .lengths.builder import build_lengths
    from .lengths.unpaired import unpaired_labels
    from .lengths.stats import BucketChoice, optimal_bucket_choices, optimal_bucket_edges, percentiles
    from .lengths.cache import LengthCache
    from .tokens.megatron import MegatronDataset, MegatronDatasetList
    from .packing.rows import PackedRow, SequenceToPack, build_row, pack_rows
    from .packing.pack import pack_lengths
    from .packing.config import OversizePolicy, PackingConfig, PackingMode
    from .packing.metrics import PackingMetrics, compute_packing_metrics
    from .plans.io import load_plan, save_plan
    from .plans.plan import BatchPlan, BatchPlanMeta, EpochPlan, MicrobatchSpec
    from .plans.verify import verify_plan
    from .samples import PreferenceSample, Sample, SampleMeta
    from .packing.columns import pack_token_arrays, pack_token_source
    from .packing.sequences import oversize_pieces, pack_sequences
    from .packing.view import PackedRows
    from .plans.sharding import shard_plan
    from .templates import sft_sample
    from .tokens.sources import open_token_source
    from .tokens.writer import tokenize_dataset
    from .tokens.store import TokenStore
    from .tokens.sharded import ShardedTokenStore, append_shards, tokenize_shard, tokenize_sharded
    from .lengths.tokenizer import LoadedTokenizer, load_tokenizer

__all__ = [
    "ChatSample",
    "encode_chat",
    "unpaired_labels",
    "BatchFingerprint",
    "BatchReader",
    "BatchWriteReport",
    "BatchWriter",
    "CollatedBatch",
    "CollationPreset",
    "MegatronDataset",
    "MegatronDatasetList",
    "ShardedTokenStore",
    "TokenStore",
    "append_shards",
    "tokenize_shard",
    "tokenize_sharded",
    "apply_preset",
    "collate_microbatch",
    "compute_batch_fingerprint",
    "default_collate",
    "fingerprint_plan_batches",
    "open_token_source",
    "tokenize_dataset",
    "verify_batch_fingerprint",
    "write_batches",
    "BatchPlan",
    "BatchPlanBuilder",
    "BatchPlanMeta",
    "BatchingConfig",
    "BucketSpec",
    "EpochPlan",
    "MicrobatchSpec",
    "OversizePolicy",
    "PackedRow",
    "PackedRows",
    "PackingConfig",
    "PackingMetrics",
    "PackingMode",
    "SequenceToPack",
    "PadPolicy",
    "BucketChoice",
    "LengthCache",
    "LoadedTokenizer",
    "PreferenceBatch",
    "PreferenceSample",
    "collate_preference",
    "collate_preference_microbatch",
    "split_pairs",
    "Sample",
    "SampleMeta",
    "build_lengths",
    "build_row",
    "compute_packing_metrics",
    "create_segment_attention_mask",
    "dataset_fingerprint",
    "load_plan",
    "load_tokenizer",
    "optimal_bucket_choices",
    "optimal_bucket_edges",
    "oversize_pieces",
    "pack_lengths",
    "pack_rows",
    "pack_sequences",
    "pack_token_arrays",
    "pack_token_source",
    "percentiles",
    "save_plan",
    "sft_sample",
    "shard_plan",
    "tokenizer_fingerprint",
    "verify_plan",
]

__getattr__, __dir__ = lazy(__name__, __file__)
