"""The hostile-input harness judges what it is meant to judge (tests/hostile_support.py)."""

from __future__ import annotations

import os

import hostile_support as hs


def test_a_documented_refusal_passes(tmp_path):
    outcome = hs.cli("plan", "info", str(tmp_path / "missing"), cwd=tmp_path)
    hs.assert_refused(outcome, outcome.stderr.split()[1].rstrip(":"), names=tmp_path / "missing")


def test_a_traceback_is_not_a_refusal(tmp_path):
    outcome = hs.python("raise RuntimeError('boom')", cwd=tmp_path)
    try:
        hs.assert_refused(outcome, "ANY")
    except AssertionError:
        return
    raise AssertionError("a traceback passed as a refusal")


def test_a_hang_is_reported_as_one(tmp_path):
    outcome = hs.python("import time; time.sleep(30)", cwd=tmp_path, wall_s=1)
    assert outcome.hung


def test_the_memory_limit_stops_a_runaway_allocation(tmp_path):
    outcome = hs.python("b = bytearray(4 << 30)", cwd=tmp_path)
    assert outcome.returncode not in (0, None) and "MemoryError" in outcome.stderr


def test_tree_state_sees_a_write_through_a_link(tmp_path):
    (tmp_path / "victim").write_text("keep")
    os.symlink(tmp_path / "victim", tmp_path / "link")
    before = hs.tree_state(tmp_path)
    (tmp_path / "link").write_text("overwritten")
    after = hs.tree_state(tmp_path)
    assert hs.changed_paths(before, after) == {"victim"}
    try:
        hs.assert_untouched(before, after, owned=["out"])
    except AssertionError:
        return
    raise AssertionError("a change outside the target went unseen")
