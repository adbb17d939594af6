"""The sampling-mode registry (umlos_cuda.modes), and a toy mode added through it alone.

The registry maps a mode's name to everything the mode is; backends, the
sampler resolution and the checkpoint identity dispatch through it. The test
proves it on a toy mode, the identity order, registered at test time without
touching any module of the package: its plan builder and reference map are
Python functions below, its kernel header and native entry point are C++ in
tests/kernel_harness/ (compiled here as the extension module
``umlos_test_identity``), and the numpy and native backends run it through the
registry's entries. Unknown names, and modes a backend has no compiled code
for, are INVALID_MANIFEST naming the allowed values.
"""

from __future__ import annotations

import importlib
import sysconfig
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import oracle
import pytest
from native_build import PACKAGE_DIR, build_shared

import umlos_cuda as uc
from umlos_cuda import errors, modes
from umlos_cuda.backends import get_backend
from umlos_cuda.errors import UmlosError
from umlos_cuda.hashing import hash_canonical
from umlos_cuda.modes import SamplingMode, block_affine
from umlos_cuda.sampler import resolve_sampler, sampler_config_hash

from nbcases import raw_manifest

U64 = (1 << 64) - 1
SEED16 = bytes(range(16))
TOY = "identity"
TOY_TOKENS = ("epoch_seed_rule_v2", "identity_order_toy_v1", "rank_contiguous_shard_v1")


# ---------------------------------------------------------------- the built-in registry


def test_block_affine_is_the_default_and_first_built_in_mode():
    assert modes.mode_names()[0] == "block_affine"
    assert set(modes.mode_names()) == {mode.name for mode in modes.BUILT_IN}
    assert modes.DEFAULT_MODE == "block_affine"
    mode = modes.get_mode("block_affine")
    assert mode is block_affine.MODE
    assert mode.train_sampling_mode == oracle.MODE_SHUFFLE
    assert mode.streaming_sampling_mode == oracle.MODE_STREAMING
    assert dict(mode.cuda_map) == {
        "uint64": "umlos_map_positions_u64", "int64": "umlos_map_positions_i64", "int32": "umlos_map_positions_i32",
    }  # fmt: skip
    # The tokens are R9's: the independent oracle's hash comes out of them, for every sampling_mode string.
    for text in (oracle.MODE_SHUFFLE, oracle.MODE_STREAMING, oracle.MODE_SEQUENTIAL):
        for block_size, drop_last in ((1 << 20, False), (7, True)):
            want = oracle.sampler_config_hash(text, block_size, drop_last)
            assert sampler_config_hash(text, block_size, drop_last, mode="block_affine") == want


@pytest.mark.parametrize("name", ["aes", "", "BLOCK_AFFINE", None, 3])
def test_unknown_mode_names_the_allowed_values(name):
    with pytest.raises(UmlosError) as info:
        modes.get_mode(name)
    assert info.value.code == errors.INVALID_MANIFEST
    assert info.value.message == f"unknown sampling mode {name!r}; choose one of {', '.join(modes.mode_names())}"


def test_resolve_sampler_refuses_an_unknown_mode():
    with pytest.raises(UmlosError) as info:
        resolve_sampler(uc.Manifest.from_dict(raw_manifest(100)), "train", mode="aes")
    assert info.value.code == errors.INVALID_MANIFEST and "choose one of block_affine, " in info.value.message


def test_registration_refuses_clashes():
    base = block_affine.MODE
    fields = dict(train_sampling_mode="T_V1", streaming_sampling_mode="S_V1", config_tokens=(),
                  build_plan=base.build_plan, reference_map=base.reference_map,
                  plan_blocks=base.plan_blocks)  # fmt: skip
    cases = [
        (SamplingMode(name="block_affine", **fields), "already registered"),
        (SamplingMode(name="clash", **{**fields, "train_sampling_mode": oracle.MODE_SHUFFLE}), "already used"),
        (SamplingMode(name="clash", **{**fields, "streaming_sampling_mode": "SEQUENTIAL_V1"}), "already used"),
        (SamplingMode(name="clash", **{**fields, "streaming_sampling_mode": "T_V1"}), "different train and streaming"),
    ]
    for mode, why in cases:
        with pytest.raises(UmlosError) as info:
            modes.register_mode(mode)
        assert info.value.code == errors.INVALID_ARGUMENT and why in info.value.message
        assert info.value.record["failure_operator"] == errors.MODES_OPERATOR
    assert modes.mode_names() == tuple(mode.name for mode in modes.BUILT_IN)
    with pytest.raises(UmlosError) as info:
        modes.unregister_mode("block_affine")
    assert info.value.code == errors.INVALID_ARGUMENT
    for bad in ({"name": "Bad Name"}, {"cuda_map": {"uint64": "k"}},
                {"cuda_map": {"float32": "k"}, "cuda_source": "x.cu"}):
        with pytest.raises(UmlosError) as info:
            SamplingMode(**{"name": "ok", **fields, **bad})
        assert info.value.code == errors.INVALID_ARGUMENT


# ---------------------------------------------------------------- a toy mode through the registry alone


@dataclass(frozen=True)
class IdentityPlan:
    """The identity order's plan: nothing but the epoch's length."""

    mode: ClassVar[str] = TOY
    n: int

    def kernel_tables(self) -> tuple[np.ndarray, ...]:
        return ()

    def kernel_params(self) -> tuple[np.generic, ...]:
        return ()


def identity_map(plan, start: int, count: int, out: np.ndarray, stride: int = 1) -> np.ndarray:
    out[:] = np.arange(count, dtype=np.uint64)
    out *= np.uint64(stride)
    out += np.uint64(start)
    return out


def identity_mode(native_module: str = "umlos_test_identity", native_map: str | None = "map_positions") -> SamplingMode:
    return SamplingMode(
        name=TOY,
        train_sampling_mode="IDENTITY_ORDER_TOY_V1",
        streaming_sampling_mode="STREAMING_IDENTITY_ORDER_TOY_V1",
        config_tokens=TOY_TOKENS,
        build_plan=lambda seed16, n, block_size: IdentityPlan(n),
        reference_map=identity_map,
        plan_blocks=lambda n, block_size: 0,
        native_module=native_module,
        native_map=native_map,
    )


@pytest.fixture(scope="module")
def toy_native(tmp_path_factory):
    """The directory holding the toy mode's compiled native module (``umlos_test_identity``)."""
    folder = tmp_path_factory.mktemp("toy_mode")
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    build_shared("identity_mode.cpp", folder / f"umlos_test_identity{suffix}",
                 include_dirs=(sysconfig.get_paths()["include"], PACKAGE_DIR), optimise="-O1")  # fmt: skip
    return folder


@pytest.fixture
def toy(toy_native, monkeypatch):
    """The identity mode, registered for one test and removed after it."""
    monkeypatch.syspath_prepend(str(toy_native))
    importlib.invalidate_caches()
    mode = modes.register_mode(identity_mode())
    yield mode
    modes.unregister_mode(TOY)


def test_registering_adds_the_mode_and_unregistering_removes_it(toy):
    built_in = tuple(mode.name for mode in modes.BUILT_IN)
    assert modes.mode_names() == (*built_in, TOY)
    assert modes.get_mode(TOY) is toy
    with pytest.raises(UmlosError) as info:
        modes.get_mode("nope")
    assert info.value.message.endswith(f"choose one of {', '.join(built_in)}, identity")


@pytest.mark.parametrize("stage,preset,sampling_mode,drop_last", [
    ("train", None, "IDENTITY_ORDER_TOY_V1", True),
    ("eval", None, "SEQUENTIAL_V1", True),
    ("train", "streaming_infinite", "STREAMING_IDENTITY_ORDER_TOY_V1", False),
])  # fmt: skip
def test_the_sampler_takes_strings_and_hash_from_the_mode(toy, stage, preset, sampling_mode, drop_last):
    manifest = uc.Manifest.from_dict(raw_manifest(1000, 64, drop_last=True))
    sampler = resolve_sampler(manifest, stage, preset, mode=TOY)
    assert sampler.mode is toy and sampler.sampling_mode == sampling_mode and sampler.drop_last is drop_last
    assert sampler.config_hash == hash_canonical([sampling_mode, 64, drop_last, *TOY_TOKENS])
    default = resolve_sampler(manifest, stage, preset)
    assert default.mode is block_affine.MODE and default.config_hash != sampler.config_hash


WINDOWS = [(0, 0, 1), (0, 1000, 1), (17, 40, 1), (3, 250, 4), (999, 1, 7), (0, 2, 999)]


@pytest.mark.parametrize("backend_name", ["numpy", "native"])
def test_toy_mode_runs_on_the_backend_through_the_registry(toy, backend_name):
    try:
        backend = get_backend(backend_name)
    except UmlosError as exc:
        pytest.skip(f"backend {backend_name!r} unavailable: {exc.message}")
    plan = backend.build_plan(SEED16, 1000, 64, TOY)
    assert isinstance(plan, IdentityPlan) and plan.n == 1000
    for start, count, stride in WINDOWS:
        want = [start + i * stride for i in range(count)]
        got = backend.map_train(plan, start, count, stride=stride)
        assert got.dtype == np.uint64 and [int(v) for v in got] == want
        out = np.empty(count, dtype=np.int32)
        assert backend.map_train(plan, start, count, out, stride=stride) is out
        assert [int(v) for v in out] == want
    with pytest.raises(UmlosError) as info:
        backend.map_train(plan, 998, 2, stride=2)
    assert info.value.code == errors.GLOBAL_POSITION_EXCEEDS_CARDINALITY


def test_native_runs_the_toy_modes_own_compiled_entry_point(toy, monkeypatch):
    """The native backend calls the module and function the registry names, not a Python fallback."""
    try:
        backend = get_backend("native")
    except UmlosError as exc:
        pytest.skip(f"backend 'native' unavailable: {exc.message}")
    compiled = importlib.import_module("umlos_test_identity")
    assert compiled.__file__.endswith(sysconfig.get_config_var("EXT_SUFFIX"))
    assert backend.entry_point(toy) is compiled.map_positions
    calls = []
    monkeypatch.setattr(compiled, "map_positions", lambda *args: calls.append(args))
    backend.map_train(IdentityPlan(10), 2, 3, stride=3)
    assert [args[:3] for args in calls] == [(2, 3, 3)]  # no tables, no params: start, count, stride, out


@pytest.mark.parametrize("native_module,native_map,why", [
    ("umlos_test_identity", None, "has no native entry point"),
    ("umlos_test_identity", "no_such_function", "which the installed module lacks"),
    ("umlos_no_such_module", "map_positions", "which is not importable"),
])  # fmt: skip
def test_native_refuses_a_mode_without_native_code(toy_native, monkeypatch, native_module, native_map, why):
    try:
        backend = get_backend("native")
    except UmlosError as exc:
        pytest.skip(f"backend 'native' unavailable: {exc.message}")
    monkeypatch.syspath_prepend(str(toy_native))
    modes.register_mode(identity_mode(native_module, native_map))
    try:
        with pytest.raises(UmlosError) as info:
            backend.map_train(IdentityPlan(10), 0, 5)
    finally:
        modes.unregister_mode(TOY)
    assert info.value.code == errors.INVALID_MANIFEST
    assert why in info.value.message and "backend 'native' runs block_affine" in info.value.message
