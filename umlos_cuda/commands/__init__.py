"""The ``umlos-cuda`` subcommands: one module per subcommand, each defining ``register(subparsers)``.

    nextbatch, nextbatch_v1   next-batch, indices, next-batch-v1
    demo, selftest, env       the demo job, the self-test, the machine report
    golden, quality           conformance vectors; how each sampling mode mixes
    checkpoint                inspect, verify, recover, gc of checkpoint stores
    data, plan, batch, gym    the LLM stack: length caches and token stores, plans, batch files, online streams

Private helpers, used by these modules only: ``_args`` (shared flags), ``_dataset_args`` and
``_tokenize`` (dataset reading), ``_sampling_mode``, ``_progress`` (progress lines with rate and
time left), ``_device_info`` (NVML), ``_golden_vectors`` (computing and comparing golden cases),
``_checkpoint_demo``.
"""
