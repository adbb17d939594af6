"""Real multi-process runs: ``torchrun --standalone --nproc_per_node=4`` (gloo, CPU).

Three launches in all (tests/dist_scripts/sampler_worker.py): W = 4 from the
start (DistributedSampler epoch 0 and half of epoch 1, NextBatchSampler epoch 0
and two global batches of epoch 1, exact evaluation, a DDP model trained with
DistributedSampler given PyTorch's arguments), then W = 2 and W = 3 side by
side, each resuming from the W = 4 states. Each launch's rank 0 checks what
all ranks read and writes a report; here the reports are checked again against
sequences computed in this process.
"""

from __future__ import annotations

import importlib.util
import json
import os
from itertools import chain

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (the optional 'torch' extra)")
if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("this torch build has no gloo backend for torch.distributed", allow_module_level=True)

from dist_scripts.torchrun import SCRIPTS, finish, launch  # noqa: E402

WORKER = os.path.join(SCRIPTS, "sampler_worker.py")

EXPECTED_START = [
    "distributed_sampler_epoch0",
    "distributed_sampler_epoch1_head",
    "nextbatch_sampler_epoch0_and_head",
    "exact_eval",
    "ddp_training",
]
EXPECTED_RESUME = ["distributed_sampler_resume", "nextbatch_sampler_resume"]


def _worker_module():
    spec = importlib.util.spec_from_file_location("sampler_worker", WORKER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _launch(nproc: int, phase: str, workdir: str):
    return launch(nproc, "sampler_worker.py", "--phase", phase, "--workdir", workdir)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    workdir = str(tmp_path_factory.mktemp("torchrun"))
    finish(_launch(4, "start", workdir), "torchrun W=4 (start)")
    resumes = {w: _launch(w, "resume", workdir) for w in (2, 3)}
    for w, proc in resumes.items():
        finish(proc, f"torchrun W={w} (resume)")
    reports = {}
    for name in ("start-w4", "resume-w2", "resume-w3"):
        with open(os.path.join(workdir, f"report-{name}.json")) as fh:
            reports[name] = json.load(fh)
    return reports


def test_w4_run_passes_rank0_checks(runs):
    report = runs["start-w4"]
    assert report["world_size"] == 4
    assert report["checks"] == EXPECTED_START


def test_w4_distributed_sampler_epoch0_equals_w1(runs):
    worker = _worker_module()
    per_rank = runs["start-w4"]["ds_epoch0"]
    flat = list(chain.from_iterable(per_rank))
    assert sorted(flat) == list(range(worker.DS_N))  # every index once, so disjoint
    assert [len(x) for x in per_rank] == [26, 26, 26, 25]  # 103 = 4 * 25 + 3, pad=False
    assert worker.interleave(per_rank) == worker.w1_order(0)


def test_w4_eval_and_training(runs):
    report = runs["start-w4"]
    assert report["eval_steps"] == 4  # ceil(50 / (4 * 4)) for every rank
    assert report["train_steps"] == 9  # 3 epochs of 96 / 4 / 8 steps


@pytest.mark.parametrize("world", [2, 3])
def test_elastic_resume_equals_uninterrupted_w1(runs, world):
    worker = _worker_module()
    start, resumed = runs["start-w4"], runs[f"resume-w{world}"]
    assert resumed["world_size"] == world
    assert resumed["checks"] == EXPECTED_RESUME
    # DistributedSampler: epoch 1 = W=4 head, then the W=`world` rest
    position = start["ds_state"]["global_position"]
    assert position == worker.DS_STEPS_BEFORE_SAVE * worker.DS_BATCH * 4
    head = worker.interleave(start["ds_epoch1_head"])
    rest = worker.interleave(resumed["ds_rest"], position)
    assert head + rest == worker.w1_order(1)
    # NextBatchSampler: epochs 0..2 = W=4 epoch 0 + head of 1, then the rest at W=`world`
    assert start["nb_epoch0"] + start["nb_epoch1_head"] + resumed["nb_rest"] == worker.nb_w1_steps(3)
