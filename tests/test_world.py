"""umlos_cuda.world: one rank and world-size resolution for the torch samplers
and the DALI source, with no torch import and each caller's operator in its errors."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

import umlos_cuda as uc
from nbcases import raw_manifest
from umlos_cuda import errors, world


@pytest.fixture
def no_launcher(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setattr(world, "torch_distributed", lambda: None)


def test_precedence_argument_then_environment_then_one_process(no_launcher, monkeypatch):
    assert world.resolve_world(operator="x") == (1, 0)
    monkeypatch.setenv("WORLD_SIZE", "6")
    monkeypatch.setenv("RANK", "4")
    assert world.resolve_world(operator="x") == (6, 4)
    assert world.resolve_world(8, operator="x") == (8, 4)
    assert world.resolve_world(None, 1, operator="x") == (6, 1)
    monkeypatch.setenv("RANK", " ")
    assert world.resolve_world(operator="x") == (6, 0)


def test_an_initialised_process_group_comes_before_the_environment(no_launcher, monkeypatch):
    class Group:
        @staticmethod
        def get_world_size():
            return 3

        @staticmethod
        def get_rank():
            return 2

    monkeypatch.setenv("WORLD_SIZE", "6")
    monkeypatch.setattr(world, "torch_distributed", lambda: Group)
    assert world.resolve_world(operator="x") == (3, 2)


@pytest.mark.parametrize(
    "world_size,rank,environ,message",
    [
        (4, 4, {}, r"^Invalid rank 4, rank should be in the interval \[0, 3\]$"),
        (0, 0, {}, r"^Invalid num_shards 0, num_shards should be in the interval \[1, 4294967295\]$"),
        (2**32, 0, {}, r"^Invalid num_shards 4294967296, "),
        (2.0, 0, {}, r"^Invalid num_shards 2\.0 \(float\), num_shards should be an integer in the interval"),
        (2, True, {}, r"^Invalid rank True \(bool\)"),
        (None, 0, {"WORLD_SIZE": "two"}, r"^environment variable WORLD_SIZE='two' is not an integer$"),
    ],
)
def test_errors_are_invalid_rank_with_the_callers_operator(no_launcher, monkeypatch, world_size, rank, environ,
                                                           message):
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(uc.UmlosError) as info:
        world.resolve_world(world_size, rank, size_name="num_shards", operator="caller.Op_v1")
    assert info.value.code == errors.INVALID_RANK and re.search(message, info.value.message), info.value.message
    assert info.value.record["failure_operator"] == "caller.Op_v1"


def test_the_dali_source_reports_its_own_operator(no_launcher):
    """Before the resolution moved here, a bad shard of the DALI source came
    from the torch integration and named it (umlos_cuda.torch)."""
    from umlos_cuda.dali import IndexSource

    with pytest.raises(uc.UmlosError) as info:
        IndexSource(raw_manifest(100, 8, 8), "train", shard_id=4, num_shards=4)
    assert info.value.code == errors.INVALID_RANK
    assert info.value.record["failure_operator"] == errors.DALI_OPERATOR


def test_the_torch_samplers_keep_pytorchs_value_error(no_launcher):
    pytest.importorskip("torch", reason="torch is not installed (the optional 'torch' extra)")
    from umlos_cuda.torch import DistributedSampler, SamplerArgumentError

    with pytest.raises(SamplerArgumentError, match=r"^INVALID_RANK: Invalid rank 9, rank should be") as info:
        DistributedSampler(10, 8, 9)
    assert isinstance(info.value, ValueError)
    assert info.value.record["failure_operator"] == errors.TORCH_OPERATOR


def test_the_dali_source_uses_no_torch_module():
    """The DALI source resolves its shard without importing the torch
    integration (nor torch itself)."""
    code = (
        "import sys, umlos_cuda.dali as ud\n"
        "s = ud.IndexSource({'seed': 1, 'global_batch_size': 8,"
        " 'datasets': {'train': {'id': 'd', 'version': '1', 'hash': 'sha256:' + '0' * 64, 'cardinality': 100}}},"
        " 'train', shard_id=1, num_shards=2)\n"
        "loaded = sorted(m for m in sys.modules if m == 'torch' or m.startswith(('torch.', 'umlos_cuda.torch')))\n"
        "assert s.num_shards == 2 and not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
