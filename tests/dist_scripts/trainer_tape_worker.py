"""One rank of a ``torchrun --standalone`` Trainer run that records its steps on a checkpoint store's tape (gloo,
CPU): rank 0 gives ``plan_tape`` the store, every other rank ``True`` (its microbatches' rows go to rank 0 at each
step's end).

Arguments: the folder of tests/test_trainer.py's ``plans`` fixture (``store``, ``padded``) and the checkpoint store
rank 0 writes. The model is that test's tiny Llama (seed 0); 6 optimizer steps of one microbatch a rank, a
checkpoint (and so a tape commit) every 3.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
import transformers

from umlos_cuda.torch import run_distributed
from umlos_cuda.torch.trainer import PlanTrainerData, plan_trainer_class

STEPS = 6


def main(root: str, store_path: str) -> None:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: the store's identity
    from test_checkpoint_support import DATASET, KEY, identity

    from umlos_cuda.checkpoint import CheckpointStore

    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    data = PlanTrainerData(os.path.join(root, "padded"), os.path.join(root, "store"))  # rank, world: the group's
    vocab = max(int(data.dataset.source.arrays(r)[0].max()) for r in range(len(data.dataset))) + 1
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=vocab, max_position_embeddings=512, attn_implementation="sdpa", use_cache=False))
    args = transformers.TrainingArguments(os.path.join(root, f"tape-out-w{dist.get_world_size()}"), max_steps=STEPS,
                                          save_steps=3, per_device_train_batch_size=1, report_to="none",
                                          use_cpu=True, disable_tqdm=True)
    store = None
    if dist.get_rank() == 0:
        store = CheckpointStore.open(store_path, identity(), KEY)
        store.start_run(DATASET, world_size=dist.get_world_size(), task_type="training")
    try:
        plan_trainer_class()(model=model, args=args, plan_data=data,
                             plan_tape=store if store is not None else True).train()
    finally:
        if store is not None:
            store.close()


if __name__ == "__main__":
    run_distributed(lambda: main(sys.argv[1], sys.argv[2]))
