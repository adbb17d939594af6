"""Tokens on disk, where collation reads them from.

Modules:
    store     :class:`TokenStore`: a tokenized dataset as flat, memory-mapped arrays
    writer    write a token store from a dataset of any format records/ reads (``umlos-cuda data tokenize``)
    megatron  read a Megatron-LM indexed dataset (``.idx`` + ``.bin``), or several as one
    export    write a token store as a Megatron-LM pair
    sharded   sharded token stores: the public names (from logical, index, adopt, partition)
    logical   :class:`ShardedTokenStore`: many shards read as one store, global rows
    index     a sharded store's ``meta.json``, read and written
    rows      per-row digests and the logical dataset hash
    adopt     create a sharded store, append shards (written stores moved in, index last)
    partition tokenize one input file as one shard (``data tokenize --sharded``)
    distributed  the same shards written by a Ray Data job (``data tokenize --engine ray``)
    concat    parts read as one token source with global rows
    sources   open any of them as a token source (whole, for collation)
    offsets   a token store's and a sharded store's lengths from their mapped offsets, by rows
    mapped    a Megatron pair read by rows (``umlos_cuda.batching.sources`` opens plans' sources with both)
    loss_counts  each row's loss tokens (its loss mask's non-zero values), what token quotas count in
"""
