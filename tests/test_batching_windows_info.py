"""``plan info`` on windowed plan folders (docs/batching.md, "Windowed packed plans"): the definition and the
index's counts, text and JSON, per-rank microbatch counts under k mod R, no window planned."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from umlos_cuda.batching.lengths.cache import LengthCache
from umlos_cuda.batching.plans.windows import load_windowed_plan
from umlos_cuda.batching.plans.windows import plan as plan_module
from umlos_cuda.cli import main


@pytest.fixture
def built(tmp_path, capsys):
    lengths = np.random.default_rng(4).integers(1, 2048, 5000).astype(np.uint32)
    path = os.path.join(tmp_path, "lengths.jsonl")
    LengthCache.from_arrays(None, lengths, "tok").write(path)
    folder = os.path.join(tmp_path, "wp")
    assert main(["plan", "build", "--lengths", path, "--pack", "--pack-max-len", "2048", "--token-budget", "8192",
                 "--epochs", "2", "--window", "700", "--quiet", "--output", folder]) == 0
    capsys.readouterr()
    return folder, lengths


def test_plan_info_reports_a_windowed_packed_plan_from_its_index(built, capsys, monkeypatch):
    folder, lengths = built
    plan = load_windowed_plan(folder)
    monkeypatch.setattr(plan_module, "plan_window", None)  # info plans no window: calling it would fail
    assert main(["plan", "info", folder, "--json", "--world-size", "3"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["kind"] == "windowed plan" and report["fingerprint"] == plan.fingerprint
    assert report["pack_config"]["max_length"] == 2048 and report["window"]["num_windows"] == 8
    for e, stats in enumerate(report["epochs"]):
        assert stats["microbatches"] == plan.epoch_microbatches(e)
        assert stats["samples"] + stats["skipped"] == 5000 and stats["tokens"] == int(lengths.sum())
        assert stats["rows"] * 2048 == stats["padded_tokens"]
        assert sum(r["microbatches"] for r in stats["ranks"]) == stats["microbatches"]
        assert [r["microbatches"] for r in stats["ranks"]] == [len(range(r, stats["microbatches"], 3))
                                                              for r in range(3)]
    assert main(["plan", "info", folder, "--world-size", "4", "--rank", "1"]) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"windowed plan {folder}\n") and f"fingerprint {plan.fingerprint}" in text
    assert "packed: first_fit, rows of 2048 tokens, 4 rows per microbatch" in text
    assert "    rank 1: " in text and "rank 0" not in text


def test_plan_info_refuses_too_many_ranks_and_a_rank_without_world_size(built, capsys):
    folder, _ = built
    assert main(["plan", "info", folder, "--rank", "1"]) == 2
    assert "error BATCHING_CONFIG_INVALID" in capsys.readouterr().err
    assert main(["plan", "info", folder, "--world-size", str(1 << 17)]) == 2
    assert "error BATCHING_CONFIG_INVALID" in capsys.readouterr().err
    assert main(["plan", "info", folder, "--world-size", str(1 << 17), "--rank", "5"]) == 0
