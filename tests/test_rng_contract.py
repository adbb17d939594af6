"""The RNG consumption contract (docs/spec/rng.md §4; umlos_cuda.rng.contract): one
test per violation shape (too many, too few, wrong stream, nested operators),
the failure record and its tape record, the declaration table."""

from __future__ import annotations

import pytest

import umlos_cuda as uc
from nbcases import raw_manifest
from umlos_cuda import errors
from umlos_cuda.rng.streams import RngStreams, consumes

RAW = raw_manifest(1000, 64, 48, seed=11)


class ListTape(list):
    """A stand-in for CheckpointStore.tape: anything with append(record)."""


def streams_with_tape():
    streams = RngStreams.from_manifest(RAW)
    tape = ListTape()
    streams.accountant.attach(tape, t=7)
    return streams, tape


def violation(function, *args) -> uc.UmlosError:
    with pytest.raises(uc.UmlosError) as info:
        function(*args)
    assert info.value.code == errors.RNG_CONSUMPTION_VIOLATION
    return info.value


def check_record(error, streams, operator, expected, actual):
    record = error.record
    assert record["failure_code"] == errors.RNG_CONSUMPTION_VIOLATION
    assert record["failure_operator"] == operator
    assert record["diagnostics"] == {"expected": expected, "actual": actual}
    assert record["replay_token"] == uc.Manifest.from_dict(RAW).replay_token.hex()
    assert record["rng_fingerprint_t"] == streams.fingerprint().hex()  # the state after the operator
    assert len(bytes.fromhex(record["state_fp_t"])) == 32
    assert record["t"] == 7


# ---------------------------------------------------------------- the four shapes
def test_too_many_draws():
    streams, tape = streams_with_tape()

    @consumes(streams, "misc", 1, operator="test.TooMany_v1")
    def operator():
        streams.draw("misc", 2)

    error = violation(operator)
    check_record(error, streams, "test.TooMany_v1", {"init": 0, "cluster": 0, "misc": 1},
                 {"init": 0, "cluster": 0, "misc": 2})
    assert "misc +2 (expected 1)" in error.message and "exactly 1 draw from stream misc" in error.message
    assert len(tape) == 1 and tape[0]["failure_code"] == errors.RNG_CONSUMPTION_VIOLATION


def test_too_few_draws():
    streams, _ = streams_with_tape()

    @consumes(streams, "init", 2, operator="test.TooFew_v1")
    def operator():
        streams.draw("init", 1)

    error = violation(operator)
    check_record(error, streams, "test.TooFew_v1", {"init": 2, "cluster": 0, "misc": 0},
                 {"init": 1, "cluster": 0, "misc": 0})


def test_wrong_stream():
    streams, _ = streams_with_tape()

    @consumes(streams, "misc", 1, operator="test.WrongStream_v1")
    def operator():
        streams.draw("cluster", 1)

    error = violation(operator)
    check_record(error, streams, "test.WrongStream_v1", {"init": 0, "cluster": 0, "misc": 1},
                 {"init": 0, "cluster": 1, "misc": 0})


def test_draws_from_an_operator_declared_none():
    streams, _ = streams_with_tape()

    @consumes(streams)  # exactly 0 draws from stream none, the default
    def pure():
        streams.draw("init", 1)

    error = violation(pure)
    assert error.record["failure_operator"] == f"{__name__}.test_draws_from_an_operator_declared_none.<locals>.pure"
    assert error.record["diagnostics"]["actual"] == {"init": 1, "cluster": 0, "misc": 0}


def test_nested_operators_count_what_they_call():
    """An operator's delta includes its callees' draws: the outer one declares
    the sum, and drawing beyond it is the outer operator's violation."""
    streams, tape = streams_with_tape()

    @consumes(streams, "cluster", 31, operator="test.KMeans_v1")
    def kmeans():
        streams.draw("cluster", 31)

    @consumes(streams, "cluster", 31, operator="test.Activate_v1")
    def activate():  # as the kernel's ActivateNonParamModule_v1 declares its k-means' 31 draws
        kmeans()

    @consumes(streams, "cluster", 31, operator="test.ActivateTwice_v1")
    def activate_twice():
        kmeans()
        kmeans()

    activate()
    assert streams.offset("cluster") == 31 and not tape
    error = violation(activate_twice)
    assert error.record["failure_operator"] == "test.ActivateTwice_v1"  # the inner calls were both right
    assert error.record["diagnostics"]["actual"]["cluster"] == 62
    assert streams.accountant.open_operators() == []


def test_a_nested_violation_is_reported_once_by_the_innermost_operator():
    streams, tape = streams_with_tape()

    @consumes(streams, "misc", 1, operator="test.Inner_v1")
    def inner():
        streams.draw("misc", 3)

    @consumes(streams, "misc", 1, operator="test.Outer_v1")
    def outer():
        inner()

    error = violation(outer)
    assert error.record["failure_operator"] == "test.Inner_v1"
    assert [record["failure_operator"] for record in tape] == ["test.Inner_v1"]
    assert streams.accountant.open_operators() == []


def test_context_manager_form_and_correct_use():
    streams, tape = streams_with_tape()
    with consumes(streams, "misc", 1, operator="test.Block_v1") as declaration:
        assert streams.accountant.open_operators() == ["test.Block_v1"]
        streams.draw("misc", 1)
    assert declaration.line == "RNG consumption: exactly 1 draw from stream misc"
    with pytest.raises(uc.UmlosError) as info, consumes(streams, "misc", 1):  # named file:line
        pass
    assert info.value.code == errors.RNG_CONSUMPTION_VIOLATION
    assert info.value.record["failure_operator"].startswith("test_rng_contract.py:")
    assert not streams.accountant.open_operators() and len(tape) == 1


def test_an_operator_that_raises_is_not_checked():
    streams, tape = streams_with_tape()

    @consumes(streams, "misc", 1, operator="test.Raises_v1")
    def operator():
        streams.draw("misc", 5)
        raise KeyError("its own failure")

    with pytest.raises(KeyError):
        operator()
    assert not tape and streams.accountant.open_operators() == []


# ---------------------------------------------------------------- records
def test_the_tape_record_has_the_seeds_fields_and_passes_the_tape_schema():
    pytest.importorskip("cryptography")
    from umlos_cuda.checkpoint.tape import check_record as check_tape_record

    streams, tape = streams_with_tape()
    streams.accountant.attach(state_fp=lambda: b"\x05" * 32)

    @consumes(streams, "misc", 1, operator="test.Record_v1")
    def operator():
        streams.draw("init", 2)

    error = violation(operator)
    record = tape[0]
    check_tape_record({**record, "seq": 0, "prev": bytes(32)})
    assert record["t"] == 7 and record["failure_operator"] == "test.Record_v1"
    assert record["replay_token"] == streams.replay_token
    assert record["rng_fingerprint_t"] == streams.fingerprint() and record["state_fp_t"] == b"\x05" * 32
    assert error.record["state_fp_t"] == "05" * 32
    diagnostics = record["diagnostics"]
    assert (diagnostics["expected_misc"], diagnostics["actual_misc"], diagnostics["actual_init"]) == (1, 0, 2)


def test_the_default_state_fingerprint_holds_the_cursor_and_the_rng():
    from umlos_cuda.rng.state_fingerprint import StateFingerprint

    streams, _ = streams_with_tape()
    order = bytes(range(32))
    streams.accountant.attach(cursor=(3, 96, order))
    with pytest.raises(uc.UmlosError) as info, consumes(streams, "misc", 1, operator="test.Cursor_v1"):
        pass
    expected = StateFingerprint().add_data_cursor(3, 96, order).add_rng(streams).digest()
    assert info.value.record["state_fp_t"] == expected.hex()


# ---------------------------------------------------------------- declarations
def test_declarations_are_a_table_for_audits():
    streams = RngStreams.from_manifest(RAW)

    @consumes(streams, "init", 2, operator="UML_OS.Model.Encode_v1")
    def encode():
        streams.draw("init", 2)

    @consumes(streams)
    def decode():
        return None

    table = {d.operator: (d.stream, d.draws) for d in streams.accountant.declarations()}
    assert table == {"UML_OS.Model.Encode_v1": ("init", 2), f"{__name__}.{decode.__qualname__}": ("none", 0)}
    assert encode.rng_declaration.line == "RNG consumption: exactly 2 draws from stream init"
    lines = streams.accountant.table().splitlines()
    assert lines[0].split() == ["operator", "stream", "draws"] and len(lines) == 3
    assert [d.operator for d in streams.accountant.declarations()] == sorted(table)  # declared before any call


@pytest.mark.parametrize("stream,draws",
                         [("none", 1), ("misc", 0), ("rng", 1), ("misc", -1), ("misc", True), (None, 0)])
def test_malformed_declarations_are_refused(stream, draws):
    streams = RngStreams.from_manifest(RAW)
    with pytest.raises(uc.UmlosError) as info:
        consumes(streams, stream, draws, operator="test.Bad_v1")
    assert info.value.code == errors.RNG_DECLARATION_INVALID
    assert streams.accountant.declarations() == ()


def test_an_operator_has_one_declaration():
    streams = RngStreams.from_manifest(RAW)
    consumes(streams, "misc", 1, operator="test.Once_v1")
    consumes(streams, "misc", 1, operator="test.Once_v1")  # the same again: fine
    with pytest.raises(uc.UmlosError) as info:
        consumes(streams, "misc", 2, operator="test.Once_v1")
    assert info.value.code == errors.RNG_DECLARATION_INVALID
    assert "exactly 1 draw from stream misc" in info.value.message
