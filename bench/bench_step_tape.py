"""What recording a step on the tape costs inside a training step: ``StepRecorder`` beside a tiny model's step.

The loop is examples/train_ddp.py's and the Trainer's ``plan_tape`` at one rank: examples/train_tiny_lm.py's data
(``--records`` synthetic records, its tokenizer) and model (a 2-layer Llama, hidden 64, float32, one thread), a
padded plan (token budget 512), ``--microbatches-per-step`` microbatches a step collated with their ``rows``. Per
step it times, with ``time.perf_counter_ns``:

* **model**: forward, backward and AdamW's step of the step's microbatches;
* **record**: ``StepRecorder.add`` of each microbatch (its index and rows) and ``end_step`` (``step_record``: the
  SHA-256 of the canonical CBOR of the rows, and the append to a real checkpoint store's tape), what a loop adds
  per step to be checked by ``plan explain --check-tape``. Commits are not counted: they come with checkpoints.

It prints the median and the 90th percentile of each, in microseconds, and the record's share of the step, after
``--warmup`` steps. CPU seconds of a shared machine vary; the ratio of medians is what to compare.

    python bench/bench_step_tape.py [--steps 200] [--microbatches-per-step 2] [--records 2000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--microbatches-per-step", type=int, default=2)
    parser.add_argument("--records", type=int, default=2000)
    args = parser.parse_args()

    import torch
    from torch.utils.data import DataLoader
    from train_tiny_lm import EXAMPLE_KEY_SEED, make_data, make_model

    from umlos_cuda.batching import BatchingConfig, BatchPlanBuilder, TokenStore, tokenize_dataset
    from umlos_cuda.batching.plans.explain import StepRecorder
    from umlos_cuda.batching.plans.planner import plan_manifest
    from umlos_cuda.checkpoint import CheckpointStore, RunIdentity
    from umlos_cuda.torch import PlanBatchSampler, PlanCollator, TokenDataset

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as root:
        store = os.path.join(root, "store")
        tokenize_dataset(*make_data(os.path.join(root, "data"), args.records, 0), store)
        tokens = TokenStore.open(store)
        config = BatchingConfig.predictable(512, (32, 64, 128), 256, seed=0)
        plan = BatchPlanBuilder(tokens.length_cache(), config).build(8)
        loader = DataLoader(TokenDataset(store, plan=plan), batch_sampler=(sampler := PlanBatchSampler(plan, 0, 1)),
                            collate_fn=PlanCollator(plan, preset="hf", rows=True))
        model = make_model(int(tokens.vocab_size or int(tokens.tokens.max()) + 1), 256)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        identity = RunIdentity("bench", "step-tape", plan_manifest(plan.config, len(tokens)))
        with CheckpointStore.open(os.path.join(root, "checkpoints"), identity, EXAMPLE_KEY_SEED) as checkpoints:
            checkpoints.start_run("train", world_size=1, task_type="training")
            recorder = StepRecorder(checkpoints.tape, plan.fingerprint)
            model_ns, record_ns = [], []
            batches = iter(loader)
            for t in range(1, args.steps + args.warmup + 1):
                units = []
                for _ in range(args.microbatches_per_step):
                    batch = next(batches, None)
                    if batch is None:
                        sampler.set_epoch(sampler.epoch)
                        batches = iter(loader)
                        batch = next(batches)
                    units.append((dict(sampler.last_microbatch), batch.pop("rows"), batch))
                began = time.perf_counter_ns()
                optimizer.zero_grad(set_to_none=True)
                for _, _, batch in units:
                    (model(**batch).loss / len(units)).backward()
                optimizer.step()
                trained = time.perf_counter_ns()
                for where, rows, _ in units:
                    recorder.add(where["epoch"], where["index"], rows.tolist())
                recorder.end_step(t)
                done = time.perf_counter_ns()
                if t > args.warmup:
                    model_ns.append(trained - began)
                    record_ns.append(done - trained)

    def us(values: list[int], q: float) -> float:
        return sorted(values)[int(q * (len(values) - 1))] / 1e3

    print(f"{args.steps} steps of {args.microbatches_per_step} microbatches (after {args.warmup} warm-up steps)")
    print(f"{'':>8} {'median us':>10} {'p90 us':>10}")
    for name, values in (("model", model_ns), ("record", record_ns)):
        print(f"{name:>8} {statistics.median(values) / 1e3:>10.1f} {us(values, 0.9):>10.1f}")
    share = statistics.median(record_ns) / statistics.median(model_ns)
    print(f"record / model step (medians): {100 * share:.3f} %")


if __name__ == "__main__":
    main()
