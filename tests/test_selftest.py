"""``umlos-cuda selftest``: passes on every usable backend, and fails (exit 1, a FAIL
line) when a check's answer is wrong; an unusable backend exits 2 with its code."""

from __future__ import annotations

import sys

import pytest

from umlos_cuda import backends, cli, nextbatch
from umlos_cuda.backends import get_backend, to_numpy
from umlos_cuda.commands import selftest
from umlos_cuda.epoch import PlanCache
from umlos_cuda.errors import UmlosError

CHECKS = ("philox-kat", "r9-self-check", "parity", "permutation", "exact")


def run_selftest(capsys, *argv) -> tuple[int, str, str]:
    code = cli.main(["selftest", "--quiet", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def status_of(out: str) -> dict[str, str]:
    """check name -> PASS / FAIL / SKIP from the printed lines."""
    statuses = {}
    for line in out.splitlines():
        words = line.split()
        if len(words) >= 2 and words[0] in ("PASS", "FAIL", "SKIP"):
            statuses[words[1]] = words[0]
    return statuses


def use_emulated_cupy(monkeypatch):
    """Make the registry's "cupy" the backend over test_cupy_backend's stand-in module."""
    from test_cupy_backend import make_fake_cupy

    monkeypatch.setattr(backends, "_instances", {})
    monkeypatch.setattr(backends, "_failures", {})
    monkeypatch.setattr(nextbatch, "_plans", PlanCache())
    fake = make_fake_cupy()
    monkeypatch.setitem(sys.modules, "cupy", fake)
    return fake


def test_numpy_passes(capsys):
    code, out, _ = run_selftest(capsys, "--backend", "numpy")
    assert code == 0, out
    assert "on backend numpy" in out
    assert status_of(out) == {
        "philox-kat": "PASS",
        "r9-self-check": "PASS",
        "parity": "SKIP",  # numpy is the reference
        "permutation": "PASS",
        "exact": "PASS",
    }
    assert selftest.R9_SELF_CHECK in out
    assert "all checks passed (4 passed, 1 skipped)" in out


@pytest.mark.parametrize("name", ["native", "cupy"])
def test_other_backends_pass(capsys, name):
    try:
        get_backend(name)
    except UmlosError as exc:
        pytest.skip(f"backend {name!r} unavailable: {exc.message}")
    code, out, _ = run_selftest(capsys, "--backend", name)
    assert code == 0, out
    assert status_of(out) == dict.fromkeys(CHECKS, "PASS")
    assert "identical to numpy" in out


def test_emulated_cupy_passes(capsys, monkeypatch):
    """The cupy path of every check (device Philox, launches through epoch_indices) on the stand-in."""
    fake = use_emulated_cupy(monkeypatch)
    code, out, _ = run_selftest(capsys, "--backend", "cupy")
    assert code == 0, out
    assert status_of(out) == dict.fromkeys(CHECKS, "PASS")
    assert "on backend cupy" in out
    launched = {launch[0] for launch in fake.state.launches}
    assert {"umlos_philox4x32_10_batch", "umlos_map_positions_u64"} <= launched


def test_auto_names_the_backend_it_used(capsys):
    code, out, _ = run_selftest(capsys)
    assert code == 0, out
    picked = next(name for name in backends.AUTO_ORDER if backends.available_backends()[name] == "ok")
    assert f"on backend {picked} (asked for auto)" in out


def test_wrong_r9_answer_fails(capsys, monkeypatch):
    monkeypatch.setattr(selftest, "R9_SELF_CHECK", "0" * 64)
    code, out, err = run_selftest(capsys, "--backend", "numpy")
    assert code == 1
    assert status_of(out)["r9-self-check"] == "FAIL"
    assert "r9-self-check" in err


def test_wrong_philox_answer_fails(capsys, monkeypatch):
    kats = list(selftest.PHILOX_KATS)
    counter, key, answer = kats[2]
    kats[2] = (counter, key, (answer[0] ^ 1,) + answer[1:])
    monkeypatch.setattr(selftest, "PHILOX_KATS", tuple(kats))
    code, out, _ = run_selftest(capsys, "--backend", "numpy")
    assert code == 1
    assert status_of(out)["philox-kat"] == "FAIL"
    assert "vector 2" in out


def test_wrong_indices_fail_parity_permutation_and_exact(capsys, monkeypatch):
    """A backend whose output differs from numpy in one index is caught by all three sweeps."""
    real = selftest.epoch_indices

    def corrupt(manifest, key, *, backend, **kwargs):
        result = to_numpy(real(manifest, key, backend=backend, **kwargs)).copy()
        if backend != "numpy" and result.size > 1:
            result[-1] = result[0]  # a duplicate: not a permutation, not R6, not numpy
        return result

    monkeypatch.setattr(selftest, "epoch_indices", corrupt)
    monkeypatch.setattr(selftest, "EXACT_SAMPLES", 2)  # positions 0 and count - 1 only
    use_emulated_cupy(monkeypatch)
    code, out, _ = run_selftest(capsys, "--backend", "cupy")
    assert code == 1
    statuses = status_of(out)
    assert statuses["parity"] == statuses["permutation"] == statuses["exact"] == "FAIL"
    assert statuses["philox-kat"] == statuses["r9-self-check"] == "PASS"


def test_unusable_backend_exits_2_with_its_code(capsys, monkeypatch):
    monkeypatch.setattr(backends, "_instances", {})
    monkeypatch.setattr(backends, "_failures", {})
    monkeypatch.setitem(sys.modules, "cupy", None)
    code, out, err = run_selftest(capsys, "--backend", "cupy")
    assert code == cli.EXIT_UMLOS_ERROR
    assert err.startswith("error BACKEND_UNAVAILABLE: ") and "CuPy is not installed" in err
    assert "PASS" not in out
