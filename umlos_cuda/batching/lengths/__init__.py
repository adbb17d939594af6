"""Length caches: one token count per sample, and what they are counted from.

Modules:
    fields        which fields of a record a build reads (text, prompt/response, pairs, messages, token count)
    preference    which kind of preference record the options ask for (pairs, implicit pairs, unpaired; strings or
                  conversations)
    tokenizer     load a ``tokenizers`` tokenizer from local files
    fingerprints  which tokenizer counted, which data was counted
    builder       build a length cache from a dataset and a tokenizer
    encoder       what encoding a chunk needs (the tokenizer and the text rule): what a worker receives
    workers       each chunk's encoding on one thread or N processes, results in dataset order (``--workers``)
    pairs         preference records as two rows (chosen, rejected), and caches that hold pairs
    unpaired      unpaired preference records (KTO) as one row each, the label in its id
    cache         :class:`LengthCache`: the cache file, read and written
    sources       :class:`LengthSource`: lengths by rows (a cache's ``.u32`` sidecar mapped, an array, a seeded formula)
    stats         length statistics and padding-minimising bucket edges
"""
