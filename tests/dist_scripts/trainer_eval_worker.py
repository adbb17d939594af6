"""One rank of a ``torchrun --standalone`` run of ``Trainer.evaluate()`` over a validation plan (gloo, CPU).

Arguments: the folder of tests/test_trainer_eval.py's ``split`` fixture (``store``, ``train``, ``validation``)
and the JSON file rank 0 writes: ``eval_loss`` (``float.hex``, so equal means bit-identical), the world size and
the validation plan's microbatch count. The model is the tiny Llama of that test (seed 0), the same at every rank
and every world size; ``PlanEvalData`` takes its rank and world size from the process group, which
``run_distributed`` starts and ``accelerate`` (under the Trainer) finds.
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist
import transformers

from umlos_cuda.batching import TokenStore
from umlos_cuda.torch import run_distributed
from umlos_cuda.torch.trainer import PlanEvalData, PlanTrainerData, plan_trainer_class


def main(root: str, out: str) -> None:
    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    store = TokenStore.open(os.path.join(root, "store"))
    vocab = max(int(store.arrays(row)[0].max()) for row in range(len(store))) + 1
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=vocab, max_position_embeddings=512, attn_implementation="sdpa", use_cache=False))
    evaluation = PlanEvalData(os.path.join(root, "validation"), os.path.join(root, "store"))
    args = transformers.TrainingArguments(os.path.join(root, f"eval-out-w{dist.get_world_size()}"),
                                          per_device_train_batch_size=1, report_to="none", use_cpu=True,
                                          disable_tqdm=True)
    # the train plan is not trained on here; rank 0 of 1 opens it at any world size
    trainer = plan_trainer_class()(model=model, args=args, eval_dataset=evaluation,
                                   plan_data=PlanTrainerData(os.path.join(root, "train"), os.path.join(root, "store"),
                                                             rank=0, world_size=1))
    assert (evaluation.rank, evaluation.world_size) == (dist.get_rank(), dist.get_world_size())
    metrics = trainer.evaluate()
    if dist.get_rank() == 0:
        with open(out, "w", encoding="utf-8") as handle:
            json.dump({"eval_loss": float(metrics["eval_loss"]).hex(), "world_size": dist.get_world_size(),
                       "microbatches": evaluation.microbatches}, handle)


if __name__ == "__main__":
    run_distributed(lambda: main(sys.argv[1], sys.argv[2]))
