"""Length caches: one token count per sample, and what they are counted from.

Modules:
    jsonl         stream a JSONL dataset's records in chunks, checking each line
    tokenizer     load a ``tokenizers`` tokenizer from local files
    fingerprints  which tokenizer counted, which data was counted
    builder       build a length cache from a dataset and a tokenizer
    pairs         preference records as two rows (chosen, rejected), and caches that hold pairs
    cache         :class:`LengthCache`: the cache file, read and written
    stats         length statistics and padding-minimising bucket edges
"""
