"""The one exception type of umlos-cuda and its failure codes.

R8 is abort-only: every failure stops the call with a deterministic
code and a failure record. Resolution R8 maps each invalid input to one code and
adds two (``INVALID_RANK``, ``INVALID_MANIFEST``). Callers branch on ``.code``;
the message is for people and says what was wrong and what is allowed.

docs/errors.md is the one table of every code below (tests/test_errors.py
checks that it lists each exactly once); add a row there with each new code.
Every raise names its operator: ``UmlosError`` has no default, so a record
never claims an operator that did not fail.
"""

from __future__ import annotations

from typing import Any

#: The codes of R8 (docs/spec/nextbatch-v2.md §2), and the few this project adds (each
#: documented in docs/nextbatch.md, "Failure codes"; INVALID_ARGUMENT,
#: INVALID_CURSOR and SAMPLER_STATE_INVALID in docs/errors.md).
INVALID_DATASET_KEY = "INVALID_DATASET_KEY"
CARDINALITY_MISMATCH = "CARDINALITY_MISMATCH"
BATCH_SIZE_INCONSISTENT = "BATCH_SIZE_INCONSISTENT"
GLOBAL_POSITION_EXCEEDS_CARDINALITY = "GLOBAL_POSITION_EXCEEDS_CARDINALITY"
INVALID_STAGE_TYPE = "INVALID_STAGE_TYPE"
INVALID_RANK = "INVALID_RANK"  # R8 addition
INVALID_MANIFEST = "INVALID_MANIFEST"  # R8 addition
CONTRACT_VIOLATION = "CONTRACT_VIOLATION"  # R6, SeededIntraBlockMap_v1 step 3
UINT64_OVERFLOW = "UINT64_OVERFLOW"  # docs/spec/nextbatch-v2.md §1: nothing wraps
BLOCK_TABLE_TOO_LARGE = "BLOCK_TABLE_TOO_LARGE"  # O(num_blocks) table would not fit
BACKEND_UNAVAILABLE = "BACKEND_UNAVAILABLE"  # asked for a backend this machine lacks
GOLDEN_MISMATCH = "GOLDEN_MISMATCH"  # a golden trace no longer reproduces
DEVICE_ERROR = "DEVICE_ERROR"  # the CUDA runtime failed during a call (out of memory, launch failure, lost device)
OUTPUT_DTYPE_OVERFLOW = "OUTPUT_DTYPE_OVERFLOW"  # an index the call can produce does not fit the requested dtype
REQUEST_TOO_LARGE = "REQUEST_TOO_LARGE"  # one call would return more indices than UMLOS_MAX_INDICES or memory allows
OUTPUT_PATH_INVALID = "OUTPUT_PATH_INVALID"  # an output is a link, a FIFO, in a missing folder, or --force would replace another kind
OUTPUT_EXISTS = "OUTPUT_EXISTS"  # an output file or folder exists and --force was not given
OUTPUT_WRITE_FAILED = "OUTPUT_WRITE_FAILED"  # CLI output could not be written (disk full, file size limit, I/O error)
OUTPUT_IS_INPUT = "OUTPUT_IS_INPUT"  # an output is, holds, or sits inside a path the same command reads
INVALID_ARGUMENT = "INVALID_ARGUMENT"  # an argument outside the manifest and the R8 table is mistyped or out of range (dtype, out=, stream, device, sampler seed or epoch, UMLOS_MAX_INDICES)
INVALID_CURSOR = "INVALID_CURSOR"  # a cursor built or read outside a NextBatch_v2 call is not {epoch, global_index} of integers in [0, 2^64 - 1]
SAMPLER_STATE_INVALID = "SAMPLER_STATE_INVALID"  # a sampler state to load is not one this kind of sampler wrote, or was written for another order
ARTIFACT_UNKNOWN = "ARTIFACT_UNKNOWN"  # `umlos-cuda info`/`verify` met a path that no registered artifact kind recognises, or a marker of an unknown kind

#: Checkpoint containers, run commits and the trace tape (docs/checkpoint-format.md);
#: each is documented in docs/checkpoint-format.md, "Failure codes".
CHECKPOINT_NOT_FOUND = "CHECKPOINT_NOT_FOUND"  # no container or store at the path
CHECKPOINT_IO_ERROR = "CHECKPOINT_IO_ERROR"  # the operating system refused a read or write
CHECKPOINT_CBOR_INVALID = "CHECKPOINT_CBOR_INVALID"  # malformed, non-canonical or oversized CBOR
CHECKPOINT_SCHEMA_INVALID = "CHECKPOINT_SCHEMA_INVALID"  # a field missing, unknown or of the wrong type
CHECKPOINT_SCHEMA_UNSUPPORTED = "CHECKPOINT_SCHEMA_UNSUPPORTED"  # a schema version this reader cannot read
CHECKPOINT_PATH_INVALID = "CHECKPOINT_PATH_INVALID"  # a path outside the container grammar
CHECKPOINT_FILE_MISSING = "CHECKPOINT_FILE_MISSING"  # a listed file is absent
CHECKPOINT_UNEXPECTED_FILE = "CHECKPOINT_UNEXPECTED_FILE"  # a file, link or folder the manifest does not list
CHECKPOINT_SIZE_MISMATCH = "CHECKPOINT_SIZE_MISMATCH"  # a file is shorter or longer than listed
CHECKPOINT_HASH_MISMATCH = "CHECKPOINT_HASH_MISMATCH"  # a file's bytes differ from its listed SHA-256
CHECKPOINT_MERKLE_MISMATCH = "CHECKPOINT_MERKLE_MISMATCH"  # a Merkle root or the header hash does not match
CHECKPOINT_BINDING_MISMATCH = "CHECKPOINT_BINDING_MISMATCH"  # a header field disagrees with the file it binds
CHECKPOINT_CONTENT_INVALID = "CHECKPOINT_CONTENT_INVALID"  # a file hashes right but its content is invalid
CHECKPOINT_IDENTITY_MISMATCH = "CHECKPOINT_IDENTITY_MISMATCH"  # docs/checkpoint-format.md §7: the identity rule
CHECKPOINT_CHAIN_MISMATCH = "CHECKPOINT_CHAIN_MISMATCH"  # checkpoint_hash_prev or the commit chain is broken
CHECKPOINT_SIGNATURE_INVALID = "CHECKPOINT_SIGNATURE_INVALID"  # a certificate's signature or key is wrong
CHECKPOINT_COMMIT_MISMATCH = "CHECKPOINT_COMMIT_MISMATCH"  # a certificate does not bind what the store holds
CHECKPOINT_UNCOMMITTED = "CHECKPOINT_UNCOMMITTED"  # leftovers of an interrupted commit (run recovery)
CHECKPOINT_COMMIT_ROLLED_BACK = "CHECKPOINT_COMMIT_ROLLED_BACK"  # failure record of a rolled-back commit
CHECKPOINT_LOCKED = "CHECKPOINT_LOCKED"  # another writer holds the store
CHECKPOINT_RESTORE_PROFILE = "CHECKPOINT_RESTORE_PROFILE"  # unknown or undeclared restore_profile_id
CHECKPOINT_MIGRATION_UNSUPPORTED = "CHECKPOINT_MIGRATION_UNSUPPORTED"  # no migration path between versions
CHECKPOINT_STATE_INVALID = "CHECKPOINT_STATE_INVALID"  # the state given to save cannot be stored
CHECKPOINT_STALE = "CHECKPOINT_STALE"  # a store behind the anchor the caller kept (expect_head / min_commit)
TRACE_FORMAT_INVALID = "TRACE_FORMAT_INVALID"  # a tape frame, record or field is malformed
TRACE_CHAIN_MISMATCH = "TRACE_CHAIN_MISMATCH"  # a tape's hash chain or sequence is broken
TRACE_TRUNCATED = "TRACE_TRUNCATED"  # a tape ends inside a frame

#: LLM batching (umlos_cuda.batching): samples, tokenizers, datasets, length
#: caches. Each is documented in docs/batching.md, "Failure codes"
#: (tests/test_batching_lengths.py checks that table lists this block).
SAMPLE_INVALID = "SAMPLE_INVALID"  # a Sample, SampleMeta or PreferenceSample field is missing, mistyped or inconsistent
TOKENIZER_INVALID = "TOKENIZER_INVALID"  # no tokenizer at the path, one the tokenizers library cannot load or run, or no EOS token
DATASET_UNREADABLE = "DATASET_UNREADABLE"  # the dataset is missing, not a regular file, not of its format (not gzip/zstd), truncated (no footer, no end-of-stream marker, a zstd frame without its last block), a compression bomb, a glob matches nothing, or a read failed
CHAT_TEMPLATE_INVALID = "CHAT_TEMPLATE_INVALID"  # no chat template to render messages with, or one Jinja cannot compile
CHAT_RENDER_BUDGET_EXCEEDED = "CHAT_RENDER_BUDGET_EXCEEDED"  # a chat template went past the render budget on a record (steps, characters, an operation's size, CPU seconds, memory, wall clock)
DATASET_RECORD_INVALID = "DATASET_RECORD_INVALID"  # a JSONL line or a row is not a record (not UTF-8, a lone surrogate, over 64 MiB), lacks a field, has one of the wrong type or repeats an id; two columns of one name
CHAT_CONTENT_UNSUPPORTED = "CHAT_CONTENT_UNSUPPORTED"  # a message content part that is not text (an image, audio, a file): media are not supported yet
DATASET_EMPTY = "DATASET_EMPTY"  # the dataset holds no record
LENGTHS_INVALID = "LENGTHS_INVALID"  # a length cache is missing, empty or malformed (row, id, tokenizer hash, length)
LENGTHS_SIDECAR_MISMATCH = "LENGTHS_SIDECAR_MISMATCH"  # the binary sidecar is malformed or disagrees with its JSONL

#: The kernel's RNG sub-streams, their consumption contract and the state and
#: functional fingerprints (umlos_cuda.rng: streams, contract, state_fingerprint,
#: probes; docs/spec/rng.md §4 to §6). Each is documented in docs/nextbatch.md,
#: "Failure codes", and docs/rng.md, "Failure codes".
RNG_CONSUMPTION_VIOLATION = "RNG_CONSUMPTION_VIOLATION"  # docs/spec/rng.md §4: an operator drew other than it declared
RNG_DECLARATION_INVALID = "RNG_DECLARATION_INVALID"  # a consumption declaration is malformed or contradicts the operator's earlier one
RNG_STREAM_INVALID = "RNG_STREAM_INVALID"  # a draw names no sub-stream (init, cluster, misc) or a count that is not a uint64
RNG_STATE_INVALID = "RNG_STATE_INVALID"  # an RNG state is malformed, another run's, or restored while an operator runs
FINGERPRINT_INPUT_INVALID = "FINGERPRINT_INPUT_INVALID"  # a fingerprint item is unknown, repeated or not encodable; a bad task_type

#: Batch plans (umlos_cuda.batching); each is documented in docs/batching.md, "Failure codes".
BATCHING_CONFIG_INVALID = "BATCHING_CONFIG_INVALID"  # bucket edges, budget, pad policy, seed or sampling mode refused
PLAN_NOT_FOUND = "PLAN_NOT_FOUND"  # no committed plan (meta.json) in the folder
PLAN_FORMAT_INVALID = "PLAN_FORMAT_INVALID"  # a plan file is missing, malformed or of the wrong shape or dtype
PLAN_LENGTHS_MISMATCH = "PLAN_LENGTHS_MISMATCH"  # the lengths or sample ids differ from those the plan binds
PLAN_SAMPLES_INVALID = "PLAN_SAMPLES_INVALID"  # a sample missing, repeated, out of range or skipped yet planned
PLAN_BUCKET_MISMATCH = "PLAN_BUCKET_MISMATCH"  # a bucket id or max_len disagrees with the lengths
PLAN_BUDGET_EXCEEDED = "PLAN_BUDGET_EXCEEDED"  # a microbatch holds more padded tokens than the token budget
PLAN_STATS_MISMATCH = "PLAN_STATS_MISMATCH"  # stats.json disagrees with the microbatches
PLAN_JSONL_MISMATCH = "PLAN_JSONL_MISMATCH"  # microbatches.jsonl disagrees with the binary form
PLAN_FINGERPRINT_MISMATCH = "PLAN_FINGERPRINT_MISMATCH"  # recomputed fingerprint differs from meta.json or the expected one
PLAN_NOT_REPRODUCIBLE = "PLAN_NOT_REPRODUCIBLE"  # the plan is not what its configuration builds from its lengths
PLAN_CURSOR_INVALID = "PLAN_CURSOR_INVALID"  # a plan cursor or sampler state outside the plan, or of another plan
PLAN_TAPE_MISMATCH = "PLAN_TAPE_MISMATCH"  # a run's tape names another plan, or a step that skipped, repeated or trained other rows than the plan gives
PLAN_PARENT_MISMATCH = "PLAN_PARENT_MISMATCH"  # an edited plan's parent is gone, another kind, or no longer the plan it was edited from
PLAN_PACKS_INVALID = "PLAN_PACKS_INVALID"  # a packed plan's rows do not tile its microbatches, a row is over the pack's max_length, or max_len is not it

#: Sequence packing (umlos_cuda.batching packing modules); each is documented
#: in docs/batching.md, "Failure codes" (tests/test_batching_packing.py checks it).
PACKING_CONFIG_INVALID = "PACKING_CONFIG_INVALID"  # max_length, mode, separator, oversize policy or backend refused, or lengths not non-negative integers
PACKING_SEQUENCE_TOO_LONG = "PACKING_SEQUENCE_TOO_LONG"  # a sequence longer than max_length where the oversize policy is refuse
PACKING_INPUT_INVALID = "PACKING_INPUT_INVALID"  # a sequence to pack is empty, has token ids outside [0, 2^31 - 1] or a loss mask of another length

#: Token stores, collation, batch files and batch fingerprints
#: (umlos_cuda.batching); each is documented in docs/batching.md, "Failure codes".
TOKEN_STORE_NOT_FOUND = "TOKEN_STORE_NOT_FOUND"  # no token store (meta.json) in the folder
TOKEN_STORE_INVALID = "TOKEN_STORE_INVALID"  # a store file is missing, malformed, of the wrong shape, or does not hash to meta.json
MEGATRON_INDEX_INVALID = "MEGATRON_INDEX_INVALID"  # a Megatron .idx/.bin pair is missing, malformed or inconsistent
SHARDED_STORE_INVALID = "SHARDED_STORE_INVALID"  # a sharded token store's index, row digests or shard folders are missing, malformed or disagree
SHARDED_STORE_MISMATCH = "SHARDED_STORE_MISMATCH"  # a shard cannot join a sharded token store (other tokenizer, dtype, loss-mask rule or id kind; a repeated id; a shard of another sharded store)
SHARDED_STORE_LOCKED = "SHARDED_STORE_LOCKED"  # another append holds the sharded token store (one writer at a time)
COLLATE_INPUT_INVALID = "COLLATE_INPUT_INVALID"  # samples to collate are empty, malformed, or longer than max_len
BATCH_STORE_MISMATCH = "BATCH_STORE_MISMATCH"  # the token store is not the one the plan was built from, or an index-only batch folder is read without it
BATCH_OUTPUT_MISMATCH = "BATCH_OUTPUT_MISMATCH"  # the output folder holds batch files of another plan, store or layout
BATCH_FILES_NOT_FOUND = "BATCH_FILES_NOT_FOUND"  # no finished batch folder (batches.json) at the path
BATCH_FILE_INVALID = "BATCH_FILE_INVALID"  # a batch file is missing, unreadable (a zstd frame past its size cap included), or disagrees with the plan or its digest
BATCH_FINGERPRINT_INVALID = "BATCH_FINGERPRINT_INVALID"  # a saved batch fingerprint is malformed, or n_batches is refused
BATCH_FINGERPRINT_MISMATCH = "BATCH_FINGERPRINT_MISMATCH"  # the batches' content fingerprint differs from the expected one
DISTRIBUTED_JOB_FAILED = "DISTRIBUTED_JOB_FAILED"  # a Ray job of `data tokenize --engine ray` failed other than with a task's documented error (Ray gave up, the cluster was lost, an unexpected exception)

#: Token stores read from object stores (umlos_cuda.remote); each is documented in
#: docs/object-stores.md, "Failure codes". A missing store is TOKEN_STORE_NOT_FOUND and a malformed
#: file TOKEN_STORE_INVALID, as on disk.
REMOTE_UNAVAILABLE = "REMOTE_UNAVAILABLE"  # an object-store URL without the client library (the remote extra), or one the client refuses (scheme, bucket, configuration)
REMOTE_REQUEST_FAILED = "REMOTE_REQUEST_FAILED"  # a request to the object store failed past its retry budget (timeouts, 5xx, 503 SlowDown, resets, short reads) or was refused (403)
REMOTE_OBJECT_CHANGED = "REMOTE_OBJECT_CHANGED"  # an object's ETag or size differs from what was recorded when the store was opened (rewritten in place)

#: Online streams, replay buffers, rolling plan windows and sampling policies
#: (umlos_cuda.streams); each is documented in docs/streams.md, "Failure codes".
GYM_CONFIG_INVALID = "GYM_CONFIG_INVALID"  # a game, difficulty, player, host, port, timeout or episode count refused
GYM_CONNECTION_FAILED = "GYM_CONNECTION_FAILED"  # the puzzle server refused the connection or closed it, past the reconnect budget
GYM_TIMEOUT = "GYM_TIMEOUT"  # the puzzle server sent nothing within the read timeout (a stall), past the reconnect budget
GYM_PROTOCOL_ERROR = "GYM_PROTOCOL_ERROR"  # a line from the server is not UTF-8, too long, or not what the protocol allows there
STREAM_INVALID = "STREAM_INVALID"  # a stream sample, its provenance or an offline stream's source is malformed
REPLAY_BUFFER_INVALID = "REPLAY_BUFFER_INVALID"  # a buffer size, eviction policy, priority, draw count or saved state refused
WINDOW_LOG_INVALID = "WINDOW_LOG_INVALID"  # a window log is missing, malformed, truncated inside a record, or of another run
WINDOW_REPLAY_MISMATCH = "WINDOW_REPLAY_MISMATCH"  # a rebuilt window's snapshot, plan or window fingerprint differs from the log
SAMPLING_POLICY_INVALID = "SAMPLING_POLICY_INVALID"  # a policy.yaml names an unknown policy type or key, or a weight or quota is refused

#: The mixing-quality report (umlos_cuda.quality, ``umlos-cuda quality``); each
#: is documented in docs/sampling-modes.md, "Failure codes".
LABELS_UNREADABLE = "LABELS_UNREADABLE"  # a --labels file is missing, not a regular file, or not a .npy array (pickles refused)
LABELS_INVALID = "LABELS_INVALID"  # a label array is not 1-D, is empty, holds floats or objects, or has fewer samples than one global batch

CHECKPOINT_VALIDATE_OPERATOR = "UML_OS.Checkpoint.ValidateSchema_v1"
CHECKPOINT_SERIALIZE_OPERATOR = "UML_OS.Checkpoint.Serialize_v1"
CHECKPOINT_RESTORE_OPERATOR = "UML_OS.Checkpoint.Restore_v1"
CHECKPOINT_COMMIT_OPERATOR = "UML_OS.Checkpoint.RunCommit_v1"
CHECKPOINT_MIGRATE_OPERATOR = "UML_OS.Checkpoint.Migrate_v1"
TAPE_OPERATOR = "UML_OS.IO.WriteTape_v1"

NEXTBATCH_OPERATOR = "UML_OS.Data.NextBatch_v2"
MANIFEST_OPERATOR = "UML_OS.Data.ValidateManifest_v1"
BLOCK_PERMUTE_OPERATOR = "UML_OS.Data.SeededBlockPermute_v1"  # R5 and R6: the epoch's block tables
#: Parts of this project that no UML_OS operator covers name their module.
#: Operators of this project's own parts. They are stable labels of failure
#: records, not import paths: three keep the module they first named
#: (atomic_file, golden and batching.plan now live in files/, commands/ and
#: batching/plans/), so records stay comparable across releases.
CURSOR_OPERATOR = "umlos_cuda.cursor"
DTYPES_OPERATOR = "umlos_cuda.dtypes"
BACKEND_OPERATOR = "umlos_cuda.backends"
OUTPUT_OPERATOR = "umlos_cuda.atomic_file"
GOLDEN_OPERATOR = "umlos_cuda.golden"
TORCH_OPERATOR = "umlos_cuda.torch"
DALI_OPERATOR = "umlos_cuda.dali"
DEMO_OPERATOR = "umlos_cuda.demo"
MODES_OPERATOR = "umlos_cuda.modes"
BATCH_PLAN_OPERATOR = "umlos_cuda.batching.plan"
NEXTBATCH_V1_OPERATOR = "UML_OS.Data.NextBatch_v1"
BATCHING_OPERATOR = "UML_OS.Data.Batching_v1"
PACKING_OPERATOR = "umlos_cuda.batching.packing"
STREAMS_OPERATOR = "umlos_cuda.streams"
REMOTE_OPERATOR = "umlos_cuda.remote"
QUALITY_OPERATOR = "umlos_cuda.quality"
ARTIFACTS_OPERATOR = "umlos_cuda.artifacts"
CLI_OPERATOR = "umlos_cuda.cli"


class UmlosError(Exception):
    """Raised on every failure; ``.code`` is the failure code.

    ``.record`` is the failure record of R8: ``t``, ``failure_code``,
    ``failure_operator``, ``dataset_key`` and ``data_replay_t`` (hex, or None
    when the inputs were too malformed to compute it). ``operator`` is
    required: the part that raises names itself (a module constant such as
    ``NEXTBATCH_OPERATOR``), and an entry point of the specification may
    rename it to itself (docs/errors.md, "Which operator a record names").
    """

    def __init__(
        self,
        code: str,
        message: str,
        *,
        operator: str,
        dataset_key: str | None = None,
        data_replay_t: str | None = None,
        t: int | None = None,
        **details: Any,
    ) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.record: dict[str, Any] = {
            "t": t,
            "failure_code": code,
            "failure_operator": operator,
            "dataset_key": dataset_key,
            "data_replay_t": data_replay_t,
        }
        if details:
            self.record["diagnostics"] = details


UINT64_MAX = (1 << 64) - 1
UINT32_MAX = (1 << 32) - 1
#: The largest world size: world_size and rank are uint32 (docs/spec/nextbatch-v2.md §1).
MAX_WORLD_SIZE = UINT32_MAX
