"""``plan edit``: a plan of any kind with a run's steps left out, its fingerprint chained to its parent's.

The property: for every kind (a whole plan split into pieces over 2 epochs, a windowed plan over 2 epochs, a
mixed plan, pretraining sequences over 2 epochs, a mixture of them), an edit of steps ``A:B`` asked at a world size
1-5 from a cursor gives a plan whose units, as the samplers hand them out at world sizes 1-5 stopped at a random
step and resumed at another world size, are the parent's minus those of the skipped steps, each once, computed
here from the parent's own samplers and a plain-Python definition of the steps. Then the commands (``plan
edit``, ``plan info``, ``plan verify``, ``plan explain``, ``umlos-cuda info``/``verify``), an edit of an edited
plan, a changed or missing parent (PLAN_PARENT_MISMATCH naming it), the refusals, and a toy kind.
"""

from __future__ import annotations

import json
import os
import shutil
from functools import partial

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from token_cases import make_store

from umlos_cuda import errors
from umlos_cuda.batching.plans.edits import edit_plan, load_edited_plan, save_edited_plan, skip_steps
from umlos_cuda.batching.plans.explain import explain
from umlos_cuda.batching.plans.kinds import open_plan, plan_kind_of, plan_kinds, register_plan_kind, \
    unregister_plan_kind
from umlos_cuda.cli import main
from umlos_cuda.errors import UmlosError

torch = pytest.importorskip("torch")
from test_plan_explain import BUDGET, CUT  # noqa: E402  (the flags its plans are built with)
from umlos_cuda.torch import PlanBatchSampler, SequenceBatchSampler  # noqa: E402


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, str]:
    """Two token stores and a plan of each kind over them."""
    root = tmp_path_factory.mktemp("edit")
    a, b = str(make_store(root / "a", 40, seed=6).root), str(make_store(root / "b", 20, seed=9).root)
    commands = {
        "split": ["plan", "build", "--source", a, "--max-length", "100", "--overlong", "split", "--epochs", "2",
                  *BUDGET],
        "windowed": ["plan", "build", "--window", "16", "--source", a, "--epochs", "2", *BUDGET],
        "mixed": ["plan", "build", "--window", "16", "--mix", f"{a}:0.7", f"{b}:0.3:2", "--num-samples", "60",
                  *BUDGET],
        "sequences": ["plan", "cut", "--source", a, "--eos", "2", "--tail", "pad", "--epochs", "2", *CUT],
        "mixed sequences": ["plan", "cut", "--mix", f"{a}:0.6", f"{b}:0.4", "--num-samples", "40", *CUT],
    }
    out = {"root": str(root), "a": a, "b": b}
    for name, argv in commands.items():
        out[name] = str(root / name.replace(" ", "-"))
        assert main([*argv, "--output", out[name]]) == 0
    return out


KINDS = ("split", "windowed", "mixed", "sequences", "mixed sequences")


def sampler(folder, rank: int, world_size: int, sample: bool):
    return SequenceBatchSampler(folder, 1, rank, world_size) if sample else PlanBatchSampler(folder, rank, world_size)


def run_units(folder: str, sample: bool, epochs: int, worlds: tuple[int, int], stop_after: int) -> dict:
    """What a run over ``folder`` trains, ``{(epoch, k): item}``: at ``worlds[0]`` ranks for ``stop_after`` lockstep
    steps, then resumed from rank 0's state at ``worlds[1]`` ranks to the plan's end (each rank's items keyed by
    the global unit the sampler says it handed out); a unit handed out twice fails."""
    seen: dict = {}

    def take(s, item) -> None:
        key = (s.last_microbatch["epoch"], s.last_microbatch["index"])
        assert key not in seen, f"unit {key} handed out twice"
        seen[key] = item

    first = [sampler(folder, r, worlds[0], sample) for r in range(worlds[0])]
    passes = [iter(s) for s in first]
    for _ in range(stop_after):
        for s, it in zip(first, passes):
            item = next(it, None)
            if item is not None:
                take(s, item)
    state = first[0].state_dict()
    ranks = [sampler(folder, r, worlds[1], sample) for r in range(worlds[1])]
    for s in ranks:
        s.load_state_dict(state)
    start_epoch = state["epoch"]
    for _ in range(start_epoch, epochs):
        for s in ranks:
            for item in s:
                take(s, item)
    return seen


def parent_items(folder: str, sample: bool, epochs: int) -> list[list]:
    """The parent's items per epoch, in unit order, from its sampler at world size 1."""
    s = sampler(folder, 0, 1, sample)
    return [[item for item in s] for _ in range(epochs)]


def skipped_units(lengths: list[int], first: int, stop: int, width: int, start: tuple[int, int]) -> set:
    """The units of steps ``first .. stop - 1`` of a run from ``start``, ``width`` units a step, by the definition
    (each pass from its cursor to its epoch's end, cut into steps of ``width`` consecutive units)."""
    steps: list[list] = []
    for epoch in range(start[0], len(lengths)):
        cursor = start[1] if epoch == start[0] else 0
        units = [(epoch, k) for k in range(cursor, lengths[epoch])]
        steps += [units[i:i + width] for i in range(0, len(units), width)]
    return {unit for step in steps[first:stop] for unit in step}


def expected_items(parent: list[list], skipped: set) -> dict:
    """``{(epoch, k): item}`` of the edited plan by the definition: each epoch's parent items less the skipped."""
    out = {}
    for epoch, items in enumerate(parent):
        kept = [item for k, item in enumerate(items) if (epoch, k) not in skipped]
        out.update({(epoch, k): item for k, item in enumerate(kept)})
    return out


def sample_key(item, plan, sample: bool):
    """What identifies an item: a microbatch's keys; for a plan of samples (whose sampler hands out ``(epoch, k)``
    keys of its own plan), the sample's input ids."""
    if not sample:
        return [tuple(k) if isinstance(k, tuple) else k for k in item]
    ((epoch, k),) = item
    args = (k,) if hasattr(plan, "components") else (epoch, k)
    return plan.sample(*args)["input_ids"].tolist()


def property_of(kinds: tuple[str, ...], examples: int):
    """A hypothesis test over the plans ``kinds`` (``name``) and drawn data (``data``); a run resumed past the plan's
    end is allowed to warn that its pass is empty."""
    def decorate(test):
        test = given(name=st.sampled_from(kinds), data=st.data())(test)
        test = settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck))(test)
        return pytest.mark.filterwarnings("ignore:PlanBatchSampler. the plan's last epoch")(test)
    return decorate


@property_of(KINDS, 20)
def test_an_edited_plan_is_its_parent_less_the_skipped_steps_at_any_world_size(built, tmp_path_factory, name, data):
    parent_folder = built[name]
    parent = open_plan(parent_folder)
    sample = plan_kind_of(parent_folder).unit == "sample"
    lengths = [parent.epoch_microbatches(e) for e in range(parent.num_epochs)]
    asked_world = data.draw(st.integers(1, 5), label="edit world size")
    batch = data.draw(st.integers(1, 3), label="batch size") if sample else 1
    start = (0, data.draw(st.integers(0, lengths[0] - 1), label="start cursor"))
    width = asked_world * batch
    total = sum(-(-(m - (start[1] if e == 0 else 0)) // width) for e, m in enumerate(lengths))
    first = data.draw(st.integers(0, total - 1), label="A")
    stop = data.draw(st.integers(first + 1, min(total, first + 6)), label="B")
    edited = edit_plan(parent_folder, lambda p: skip_steps(p, first, stop, world_size=asked_world, batch_size=batch,
                                                           start=start))
    out = save_edited_plan(edited, tmp_path_factory.mktemp("edited") / "plan")
    skipped = skipped_units(lengths, first, stop, width, start)
    assert edited.edit.skipped_total() == len(skipped)
    reopened = open_plan(out)
    assert reopened.fingerprint == edited.fingerprint
    want = {key: sample_key(item, parent, sample)
            for key, item in expected_items(parent_items(parent_folder, sample, parent.num_epochs), skipped).items()}
    worlds = (data.draw(st.integers(1, 5), label="world size"), data.draw(st.integers(1, 5), label="resumed at"))
    stop_after = data.draw(st.integers(0, max(1, sum(lengths) // worlds[0])), label="steps before the stop")
    got = {key: sample_key(item, reopened, sample)
           for key, item in run_units(out, sample, parent.num_epochs, worlds, stop_after).items()}
    assert got == want
    assert all(edited.parent_index(e, k) == k for e, k in want if (e, k) < (min(skipped)[0], min(skipped)[1]))


def test_the_commands_edit_report_verify_and_explain_an_edited_plan(built, tmp_path, capsys):
    out = str(tmp_path / "edited")
    assert main(["plan", "edit", built["windowed"], "--skip-steps", "2:4", "--world-size", "3", "--output", out]) == 0
    printed = capsys.readouterr().out
    assert f"edited windowed plan {out}: 6 microbatches (steps 2 to 3 at world size 3) left out" in printed
    assert plan_kind_of(out).name == "edited windowed plan"
    assert main(["plan", "info", out, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    parent = open_plan(built["windowed"])
    assert report["parent"] == {"path": built["windowed"], "fingerprint": parent.fingerprint, "kind": "windowed plan"}
    assert report["edits"] == [{"op": "skip_units", "units": [[0, 6, 12]],
                                "asked": {"skip_steps": [2, 4], "world_size": 3, "batch_size": 1, "start": [0, 0]}}]
    assert [e["units"] for e in report["epochs"]] == [parent.epoch_microbatches(0) - 6, parent.epoch_microbatches(1)]
    for argv in (["plan", "verify", out], ["verify", out], ["info", out]):
        assert main(argv) == 0
    assert "parent" in capsys.readouterr().out
    assert main(["plan", "explain", out, "--step", "2", "--world-size", "3", "--json"]) == 0
    explained = json.loads(capsys.readouterr().out)
    assert explained["origin"]["parent"] == parent.fingerprint and explained["origin"]["edits"] == report["edits"]
    units = [r["units"][0] for r in explained["steps"][0]["ranks"]]
    assert [(u["index"], u["parent_index"]) for u in units] == [(6, 12), (7, 13), (8, 14)]
    parent_units = explain(built["windowed"], 4, world_size=3)["steps"][0]["ranks"]
    assert [u["rows"] for u in units] == [r["units"][0]["rows"] for r in parent_units]
    assert main(["plan", "explain", out, "--step", "2", "--world-size", "3"]) == 0
    text = capsys.readouterr().out
    assert f"edited from {parent.fingerprint} (1 edit(s))" in text and "microbatch 6 (parent's unit 12," in text


def test_an_edit_of_an_edited_plan_chains_its_edits(built, tmp_path, capsys):
    once, twice = str(tmp_path / "once"), str(tmp_path / "twice")
    assert main(["plan", "edit", built["sequences"], "--skip-steps", "0:1", "--batch-size", "4", "--output",
                 once]) == 0
    capsys.readouterr()
    assert main(["plan", "edit", once, "--skip-steps", "1:2", "--output", twice, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["kind"] == "edited pretraining sequences" and report["parent"]["path"] == once
    assert [edit["units"] for edit in report["edits"]] == [[[0, 0, 4]], [[0, 1, 2]]]
    plan = open_plan(twice)
    assert plan.parent_index(0, 0) == 0 and plan.parent_index(0, 1) == 2
    assert plan.parent.parent_index(0, 2) == 6  # once's unit 2 is the plan's unit 6 (0 to 3 left out)
    grand = open_plan(built["sequences"])
    assert plan.epoch_microbatches(0) == grand.epoch_microbatches(0) - 5
    assert main(["plan", "verify", twice]) == 0


def test_a_changed_or_missing_parent_is_refused_naming_it(built, tmp_path):
    parent = str(tmp_path / "parent")
    shutil.copytree(built["windowed"], parent)
    out = str(tmp_path / "edited")
    assert main(["plan", "edit", parent, "--skip-steps", "0:1", "--output", out]) == 0
    assert main(["plan", "build", "--window", "16", "--source", built["a"], "--epochs", "2", "--seed", "5", *BUDGET,
                 "--output", parent, "--force"]) == 0
    for call in (lambda: open_plan(out), lambda: plan_kind_of(out).verify(out)):
        with pytest.raises(UmlosError) as caught:
            call()
        assert caught.value.code == errors.PLAN_PARENT_MISMATCH and parent in caught.value.message
    shutil.rmtree(parent)
    with pytest.raises(UmlosError) as caught:
        open_plan(out)
    assert caught.value.code == errors.PLAN_PARENT_MISMATCH and "is gone" in caught.value.message
    shutil.copytree(built["mixed"], parent)
    with pytest.raises(UmlosError) as caught:
        open_plan(out)
    assert caught.value.code == errors.PLAN_PARENT_MISMATCH and "is a mixed plan" in caught.value.message


def test_the_edited_plan_and_its_parent_move_together(built, tmp_path):
    shutil.copytree(built["windowed"], tmp_path / "a" / "parent")
    assert main(["plan", "edit", str(tmp_path / "a" / "parent"), "--skip-steps", "0:1", "--output",
                 str(tmp_path / "a" / "edited")]) == 0
    fingerprint = open_plan(tmp_path / "a" / "edited").fingerprint
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    shutil.rmtree(tmp_path / "a")
    assert open_plan(tmp_path / "b" / "edited").fingerprint == fingerprint


@pytest.mark.parametrize("argv, code, words", [
    (["--skip-steps", "3:3"], errors.BATCHING_CONFIG_INVALID, "B must be at least 4"),
    (["--skip-steps", "0:1000"], errors.PLAN_CURSOR_INVALID, "past the plan's end"),
    (["--skip-steps", "0:1", "--start", "5:0"], errors.PLAN_CURSOR_INVALID, "epoch"),
    (["--skip-steps", "0:1", "--batch-size", "2"], errors.BATCHING_CONFIG_INVALID, "one microbatch per rank"),
])
def test_the_command_refuses_with_documented_codes(built, tmp_path, argv, code, words, capsys):
    assert main(["plan", "edit", built["windowed"], *argv, "--output", str(tmp_path / "out")]) != 0
    err = capsys.readouterr().err
    assert f"error {code}:" in err and words in err
    assert not os.path.exists(tmp_path / "out")


def test_an_edited_plan_is_not_a_whole_plan_and_a_shard_is_not_edited(built, tmp_path, capsys):
    out = str(tmp_path / "edited")
    assert main(["plan", "edit", built["split"], "--skip-steps", "0:1", "--output", out]) == 0
    capsys.readouterr()
    assert main(["plan", "shard", out, "--world-size", "2", "--output", str(tmp_path / "shards")]) != 0
    assert "error PLAN_NOT_FOUND:" in capsys.readouterr().err
    assert main(["plan", "shard", built["split"], "--world-size", "2", "--output", str(tmp_path / "shards")]) == 0
    capsys.readouterr()
    assert main(["plan", "edit", str(tmp_path / "shards" / "rank_0"), "--skip-steps", "0:1", "--output",
                 str(tmp_path / "from-shard")]) != 0
    assert "edit the full plan, then shard it" in capsys.readouterr().err


def test_a_tampered_edit_is_refused(built, tmp_path):
    out = tmp_path / "edited"
    assert main(["plan", "edit", built["mixed"], "--skip-steps", "1:3", "--world-size", "2", "--output",
                 str(out)]) == 0
    meta = json.loads((out / "meta.json").read_text())
    for change, code in ((lambda m: m["edit"]["units"][0].__setitem__(2, 10 ** 6), errors.PLAN_FORMAT_INVALID),
                         (lambda m: m["edit"].__setitem__("units", [[0, 4, 5], [0, 1, 2]]),
                          errors.PLAN_FORMAT_INVALID),
                         (lambda m: m["edit"].__setitem__("op", "keep_units"), errors.PLAN_FORMAT_INVALID),
                         (lambda m: m["edit"]["units"][0].__setitem__(1, 0), errors.PLAN_FINGERPRINT_MISMATCH),
                         (lambda m: m["parent"].__setitem__("path", "edited"), errors.PLAN_FORMAT_INVALID)):
        changed = json.loads(json.dumps(meta))
        change(changed)
        (out / "meta.json").write_text(json.dumps(changed))
        with pytest.raises(UmlosError) as caught:
            open_plan(out)
        assert caught.value.code == code
    (out / "meta.json").write_text(json.dumps(meta))
    assert open_plan(out).fingerprint == meta["fingerprint"]


def test_an_edited_mixed_plan_is_collated_from_its_components_checked(built, tmp_path):
    """``TokenDataset(plan.dataset(), plan=edited)`` checks the rows against the parent's parts (``row_parts``,
    passed through: an edit changes no row) and collates the edited plan's microbatches."""
    from umlos_cuda.torch import PlanCollator, TokenDataset

    out = str(tmp_path / "edited")
    assert main(["plan", "edit", built["mixed"], "--skip-steps", "1:3", "--world-size", "2", "--output", out]) == 0
    edited = open_plan(out)
    assert edited.row_parts() == open_plan(built["mixed"]).row_parts()
    dataset = TokenDataset(edited.dataset(), plan=edited)
    keys = list(PlanBatchSampler(out, 0, 1))[2]  # the edited plan's unit 2: the parent's 6
    batch = PlanCollator(edited, preset="hf", rows=True)([dataset[key] for key in keys])
    assert batch["rows"].tolist() == edited.microbatch_at(0, 2).rows.tolist() == \
        open_plan(built["mixed"]).microbatch_at(0, 6).rows.tolist()
    with pytest.raises(UmlosError) as caught:
        TokenDataset(built["a"], plan=edited)
    assert caught.value.code == errors.BATCH_STORE_MISMATCH


def test_a_toy_kind_registered_at_run_time_is_edited_too(built, tmp_path):
    import toy_plan_kind as toy
    from umlos_cuda.batching.sources import open_source

    if toy.KIND not in plan_kinds():
        register_plan_kind(toy.KIND)
    try:
        folder = toy.KIND.save(toy.ToyPlan(open_source(f"{built['a']}/lengths.jsonl"), 7), tmp_path / "toy")
        edited = edit_plan(folder, lambda p: skip_steps(p, 1, 2, world_size=2))
        out = save_edited_plan(edited, tmp_path / "edited")
        assert plan_kind_of(out).name == "edited toy plan"
        plan = load_edited_plan(out)
        assert plan.epoch_microbatches(0) == toy.open_toy(folder).epoch_microbatches(0) - 2
        assert explain(out, 2)["steps"][0]["ranks"][0]["units"][0]["rows"] == \
            explain(folder, 4)["steps"][0]["ranks"][0]["units"][0]["rows"]
    finally:
        unregister_plan_kind(toy.KIND.name)
    assert "edited toy plan" not in [kind.name for kind in plan_kinds()]


# ---------------------------------------------------------------------- rows left out (--skip-samples)
ROW_KINDS = ("split", "windowed", "mixed")


def key_row(key) -> int:
    return key.row if hasattr(key, "row") else int(key)


@property_of(ROW_KINDS, 12)
def test_rows_left_out_from_a_step_on_are_gone_and_every_other_row_stays(built, tmp_path_factory, name, data):
    from umlos_cuda.batching.plans.edits.edit import skip_rows
    from umlos_cuda.batching.plans.edits.plan import unit_row_chunks

    folder = built[name]
    parent = open_plan(folder)
    lengths = [parent.epoch_microbatches(e) for e in range(parent.num_epochs)]
    items = parent_items(folder, False, parent.num_epochs)
    epoch = data.draw(st.integers(0, parent.num_epochs - 1), label="epoch")
    cursor = data.draw(st.integers(0, lengths[epoch] - 1), label="cursor")
    later = sorted({key_row(key) for e, per in enumerate(items) for k, item in enumerate(per)
                    if (e, k) >= (epoch, cursor) for key in item})
    rows = data.draw(st.lists(st.sampled_from(later), min_size=1, max_size=12, unique=True), label="rows")
    edit = skip_rows(parent, rows, partial(unit_row_chunks, parent), start=(epoch, cursor))
    edited = edit_plan(folder, edit)
    out = save_edited_plan(edited, tmp_path_factory.mktemp("rows") / "plan")
    want: dict = {}
    for e, per in enumerate(items):  # the definition: from the cursor on, each microbatch less the rows; none empty
        kept = [item if (e, k) < (epoch, cursor) else [key for key in item if key_row(key) not in rows]
                for k, item in enumerate(per)]
        want.update({(e, j): [tuple(key) if isinstance(key, tuple) else key for key in item]
                     for j, item in enumerate(i for i in kept if i)})
    worlds = (data.draw(st.integers(1, 5), label="world size"), data.draw(st.integers(1, 5), label="resumed at"))
    stop_after = data.draw(st.integers(0, max(1, sum(lengths) // worlds[0])), label="steps before the stop")
    got = {key: sample_key(item, None, False) for key, item in run_units(out, False, parent.num_epochs, worlds,
                                                                         stop_after).items()}
    assert got == want
    assert main(["plan", "verify", out]) == 0


@property_of(ROW_KINDS, 20)
def test_the_rows_scan_reads_windows_and_epochs_as_the_microbatches_one_by_one(built, name, data):
    """``--skip-samples`` reads a windowed plan window by window and a whole plan epoch by epoch
    (``unit_row_chunks``): from any cursor, the chunks are the microbatches' rows one by one, and the edit (the
    microbatches it empties included) is the one a scan of single microbatches makes."""
    from umlos_cuda.batching.plans.edits.edit import skip_rows
    from umlos_cuda.batching.plans.edits.plan import single_row_chunks, unit_row_chunks

    parent = open_plan(built[name])
    epoch = data.draw(st.integers(0, parent.num_epochs - 1), label="epoch")
    first = data.draw(st.integers(0, parent.epoch_microbatches(epoch) - 1), label="cursor")
    got = [(k0 + i, samples[offsets[i]:offsets[i + 1]].tolist())
           for k0, offsets, samples in unit_row_chunks(parent, epoch, first) for i in range(len(offsets) - 1)]
    want = [(k, rows.tolist()) for k, _, rows in single_row_chunks(parent, epoch, first)]
    assert got == want
    emptied = data.draw(st.sampled_from(want), label="a microbatch left empty")[1]
    later = sorted({row for _, rows in want for row in rows})
    rows = emptied + data.draw(st.lists(st.sampled_from(later), max_size=6), label="rows")
    fast = skip_rows(parent, rows, partial(unit_row_chunks, parent), start=(epoch, first))
    assert fast == skip_rows(parent, rows, partial(single_row_chunks, parent), start=(epoch, first))
    assert fast.ranges  # the emptied microbatch is left out as a unit


def test_the_command_leaves_rows_out_and_explain_lists_the_rest(built, tmp_path, capsys):
    rows_file = tmp_path / "rows.txt"
    explained = explain(built["windowed"], 3, world_size=2)["steps"][0]["ranks"]
    gone = [row["row"] for rank in explained for row in rank["units"][0]["rows"]][:3]
    rows_file.write_text("\n".join(map(str, gone)) + "\n\n")
    out = str(tmp_path / "edited")
    assert main(["plan", "edit", built["windowed"], "--skip-samples", str(rows_file), "--from-step", "3",
                 "--world-size", "2", "--output", out]) == 0
    assert f"({len(gone)} rows of {rows_file} from step 3)" in capsys.readouterr().out
    after = explain(out, 3, world_size=2)["steps"][0]["ranks"]
    listed = [row["row"] for rank in after for unit in rank["units"] for row in unit["rows"]]
    assert not set(gone) & set(listed)
    before = [explain(folder, 2, world_size=2)["steps"][0]["ranks"] for folder in (out, built["windowed"])]
    assert [[u["rows"] for u in rank["units"]] for rank in before[0]] == \
        [[u["rows"] for u in rank["units"]] for rank in before[1]]
    assert main(["plan", "info", out]) == 0
    assert f"skip {len(gone)} row(s)" in capsys.readouterr().out
    meta = json.loads((tmp_path / "edited" / "meta.json").read_text())
    meta["edit"]["units"] = [[0, 0, 1]]
    (tmp_path / "edited" / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(UmlosError) as caught:
        open_plan(out)
    assert caught.value.code == errors.PLAN_FINGERPRINT_MISMATCH


@pytest.mark.parametrize("plan, lines, words", [
    ("windowed", "7\nseven\n", "line 2"),
    ("windowed", "100000\n", "in no microbatch"),
    ("sequences", "1\n", "leave out its steps"),
    ("missing", "1\n", "does not exist"),
])
def test_rows_edits_are_refused_with_batching_config_invalid(built, tmp_path, plan, lines, words, capsys):
    rows_file = tmp_path / "rows.txt"
    if plan != "missing":
        rows_file.write_text(lines)
    assert main(["plan", "edit", built["sequences" if plan == "sequences" else "windowed"], "--skip-samples",
                 str(rows_file), "--output", str(tmp_path / "out")]) != 0
    err = capsys.readouterr().err
    assert "error BATCHING_CONFIG_INVALID:" in err and words in err
