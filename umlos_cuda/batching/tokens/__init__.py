"""Tokens on disk, where collation reads them from.

Modules:
    store     :class:`TokenStore`: a tokenized dataset as flat, memory-mapped arrays
    writer    write a token store from a JSONL dataset (``umlos-cuda data tokenize``)
    megatron  read a Megatron-LM indexed dataset (``.idx`` + ``.bin``)
    sources   open either as a token source
"""
