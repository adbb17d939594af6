"""The UML_OS kernel's data-plane contracts on top of the order (docs/rng.md, docs/spec/rng.md).

Modules:
    streams            :class:`RngStreams`: the Philox master stream and its sub-streams ``init``, ``cluster``, ``misc``
    contract           the consumption contract: declared draws (:func:`consumes`), checked
    state_fingerprint  :class:`StateFingerprint`: one SHA-256 over a run's whole state
    probes             the functional probe set and ``functional_fp``
    nextbatch_v1       ``UML_OS.Data.NextBatch_v1``: a global permutation per epoch, strided shards
    checkpoint_kinds   the cursor kinds ``rng`` and ``fingerprints`` and the tape record ``rng.iter``
                       (registered through the ``umlos_cuda.checkpoint`` entry point, not on import)

``umlos_cuda.rng`` exports what the one module of that name exported before it
became this package.
"""

from .streams import (BACKENDS, MASTER_DERIVATION, NONE, STATE_FORMAT, STREAMS, Declaration, RngStreams, check_state,
                      consumes, master_seed, substream_blocks)

__all__ = ["BACKENDS", "MASTER_DERIVATION", "NONE", "STATE_FORMAT", "STREAMS", "Declaration", "RngStreams",
           "check_state", "consumes", "master_seed", "substream_blocks"]
