"""``plan explain``: what each rank trains on at a step, from the plan alone, for every plan kind.

Each kind is built by the commands over real token stores; the explanation of every step of a run at several
world sizes is compared with what the samplers hand each rank (``PlanBatchSampler``, ``PackedBatchSampler``,
``SequenceBatchSampler``: the keys, step by step), and its tokens and loss tokens with what the collator and the
sequences' collation make of those keys (the masks summed). A run resumed from a cursor, the command's text and
JSON, the refusals, and a toy kind that explains itself through its record close the file.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from token_cases import make_store

from umlos_cuda import errors
from umlos_cuda.batching.collate import collate_microbatch
from umlos_cuda.batching.plans.explain import ROW_FIELDS, StepExplainer, explain, lines, total_steps
from umlos_cuda.batching.plans.kinds import open_plan, plan_kind_of, plan_kinds, register_plan_kind, \
    unregister_plan_kind
from umlos_cuda.batching.tokens.store import TokenStore
from umlos_cuda.cli import main
from umlos_cuda.errors import UmlosError

torch = pytest.importorskip("torch")
from umlos_cuda.torch import PackedBatchSampler, PlanBatchSampler, PlanKey, SequenceBatchSampler  # noqa: E402
from umlos_cuda.torch._plan_keys import takes_ranges, with_pack  # noqa: E402

BUDGET = ("--bucket-edges", "64,128", "--overflow-max", "1024", "--token-budget", "1024", "--quiet")
CUT = ("--sequence-length", "32", "--window", "8", "--quiet")


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, str]:
    """Two token stores and one folder of each plan kind over them (a whole plan split into pieces of 100 tokens
    over 2 epochs, a packed one, windowed plans packed and not, a mixed plan, pretraining sequences with an EOS
    and a padded tail, and their mixture)."""
    root = tmp_path_factory.mktemp("explain")
    a, b = str(make_store(root / "a", 60, seed=6).root), str(make_store(root / "b", 30, seed=9).root)
    commands = {
        "split": ["plan", "build", "--source", a, "--max-length", "100", "--overlong", "split", "--epochs", "2",
                  *BUDGET],
        "packed": ["plan", "build", "--source", a, "--pack", "--pack-max-len", "256", "--token-budget", "1024",
                   "--quiet"],
        "windowed": ["plan", "build", "--window", "16", "--source", a, "--epochs", "2", *BUDGET],
        "windowed packed": ["plan", "build", "--window", "16", "--source", a, "--pack", "--pack-max-len", "256",
                            "--token-budget", "1024", "--quiet"],
        "mixed": ["plan", "build", "--window", "16", "--mix", f"{a}:0.7", f"{b}:0.3:2", "--num-samples", "120",
                  *BUDGET],
        "sequences": ["plan", "cut", "--source", a, "--eos", "2", "--tail", "pad", "--epochs", "2", *CUT],
        "mixed sequences": ["plan", "cut", "--mix", f"{a}:0.6", f"{b}:0.4", "--num-samples", "50", *CUT],
    }
    out = {"a": a, "b": b}
    for name, argv in commands.items():
        out[name] = str(root / name.replace(" ", "-"))
        assert main([*argv, "--output", out[name]]) == 0
    return out


MICROBATCH_PLANS = ("split", "packed", "windowed", "windowed packed", "mixed")
SAMPLE_PLANS = ("sequences", "mixed sequences")


def keys_of(unit: dict, ranges: bool) -> list:
    """The keys a batch sampler hands out for ``unit``: rows, ``PlanKey`` token ranges, with the packed row."""
    keys = []
    for row in unit["rows"]:
        key = PlanKey(row["row"], row["start"], row["stop"]) if ranges else row["row"]
        keys.append(key if row["pack"] is None else with_pack(key, row["pack"]))
    return keys


def sampler_passes(sampler, epochs: int) -> list:
    """Everything a sampler hands out over ``epochs`` passes, in order."""
    return [item for _ in range(epochs) for item in sampler]


@pytest.mark.parametrize("world_size", [1, 2, 3, 5])
@pytest.mark.parametrize("name", MICROBATCH_PLANS)
def test_each_rank_s_rows_at_each_step_are_what_its_sampler_hands_out(built, name, world_size):
    plan = open_plan(built[name])
    report = explain(built[name], 0, count=total_steps(plan, world_size), world_size=world_size)
    assert report["run_steps"] == len(report["steps"]) == total_steps(plan, world_size)
    ranges = takes_ranges(plan.config)
    for rank in range(world_size):
        sampler = PlanBatchSampler(built[name], rank=rank, world_size=world_size)
        if plan.config.pack is not None:
            sampler = PackedBatchSampler(sampler)
        handed = sampler_passes(sampler, plan.num_epochs)
        mine = [step["ranks"][rank]["units"] for step in report["steps"]]
        assert all(len(units) <= 1 for units in mine)
        assert [keys_of(units[0], ranges) for units in mine if units] == handed
        short = [step for step, units in zip(report["steps"], mine) if not units]  # only an epoch's last step
        assert all(step["cursor"] + world_size > plan.epoch_microbatches(step["epoch"]) for step in short)


@pytest.mark.parametrize("name", ["split", "packed", "windowed", "windowed packed"])
def test_tokens_and_loss_tokens_are_those_the_collator_makes(built, name):
    """Per collated row (a sample, or a packed row of several), the attention mask counts the explained tokens
    and the loss mask the explained loss tokens (a whole plan records no token source: it is given)."""
    store = TokenStore.open(built["a"])
    plan = open_plan(built[name])
    tokens = built["a"] if plan_kind_of(built[name]).name == "plan" else None
    explainer = StepExplainer.open(built[name], tokens=tokens)
    checked = 0
    for epoch in range(plan.num_epochs):
        for k in range(plan.epoch_microbatches(epoch)):
            unit = explainer.unit(epoch, k)
            spec = plan.microbatch_at(epoch, k) if hasattr(plan, "microbatch_at") else \
                plan.microbatch(epoch, plan.get_epoch(epoch).local_index(k))
            batch = collate_microbatch(store, spec)
            groups: dict[int, list[dict]] = {}
            for b, row in enumerate(unit["rows"]):
                groups.setdefault(b if row["pack"] is None else row["pack"], []).append(row)
            assert len(groups) == batch.shape[0]
            for b, rows in groups.items():
                assert int(batch.attention_mask[b].sum()) == sum(row["tokens"] for row in rows)
                assert int(batch.loss_mask[b].sum()) == sum(row["loss_tokens"] for row in rows)
            assert unit["tokens"] == int(batch.attention_mask.sum()) and unit["loss_tokens"] > 0
            checked += 1
    assert checked == sum(plan.epoch_microbatches(e) for e in range(plan.num_epochs))


def test_a_split_plan_names_each_piece_and_its_range(built):
    plan = open_plan(built["split"])
    report = explain(built["split"], 0, count=total_steps(plan, 1))
    lengths = np.asarray(plan.lengths)
    expected = sorted((d, p, 100 * p, min(100 * (p + 1), int(lengths[d]))) for d in range(len(lengths))
                      for p in range(-(-int(lengths[d]) // 100)))
    assert any(p for _, p, _, _ in expected)
    for epoch in range(2):
        pieces = sorted((row["document"], row["piece"], row["start"], row["stop"]) for step in report["steps"]
                        if step["epoch"] == epoch for unit in step["ranks"][0]["units"] for row in unit["rows"])
        assert pieces == expected  # every piece of every sample once an epoch, its own token range


def test_a_mixed_plan_names_each_row_s_component_source_and_document(built):
    plan = open_plan(built["mixed"])
    stores = [TokenStore.open(built[key]) for key in ("a", "b")]
    names = [c.name for c in plan.definition.components]
    report = explain(built["mixed"], 0, count=total_steps(plan, 1))
    seen = {name: 0 for name in names}
    for step in report["steps"]:
        (unit,) = step["ranks"][0]["units"]
        for row in unit["rows"]:
            c = names.index(row["component"])
            assert row["row"] == int(plan.definition.starts[c]) + row["document"]
            assert row["sample"] == f"{row['component']}:{row['document']}"
            assert Path(row["source"]).resolve() == Path(built["ab"[c]]).resolve()
            ids, mask = stores[c].arrays(row["document"])
            assert (row["tokens"], row["loss_tokens"]) == (len(ids), int(mask.sum()))
            seen[row["component"]] += 1
    assert sum(seen.values()) == plan.counts()["samples"] and min(seen.values()) > 0
    epochs = {row["component_epoch"] for step in report["steps"] for unit in step["ranks"][0]["units"]
              for row in unit["rows"] if row["component"] == names[1]}
    assert epochs == {0, 1}  # the second component is read twice (capped at 2 epochs)


@pytest.mark.parametrize("world_size,batch_size", [(1, 1), (2, 3), (3, 2)])
@pytest.mark.parametrize("name", SAMPLE_PLANS)
def test_each_rank_s_samples_at_each_step_are_what_the_sequence_sampler_hands_out(built, name, world_size,
                                                                                  batch_size):
    plan = open_plan(built[name])
    steps = total_steps(plan, world_size, batch_size)
    report = explain(built[name], 0, count=steps, world_size=world_size, batch_size=batch_size)
    for rank in range(world_size):
        sampler = SequenceBatchSampler(built[name], batch_size, rank=rank, world_size=world_size)
        handed = sampler_passes(sampler, plan.num_epochs)
        mine = [[(step["epoch"], unit["index"]) for unit in step["ranks"][rank]["units"]] for step in report["steps"]]
        assert [keys for keys in mine if keys] == handed
        full = [step["cursor"] + world_size * batch_size <= plan.epoch_microbatches(step["epoch"])
                for step in report["steps"]]
        assert all(len(keys) == batch_size for keys, whole in zip(mine, full) if whole)  # short: an epoch's last


@pytest.mark.parametrize("name", SAMPLE_PLANS)
def test_a_cut_sample_s_pieces_are_its_documents_and_add_up_to_its_masks(built, name):
    """The pieces are the sample's documents in order, their tokens the sample's L + 1 (fewer at a padded tail),
    their loss tokens the collated sample's loss mask summed (the EOS counted, the first token not)."""
    plan = open_plan(built[name])
    explainer = StepExplainer.open(built[name])
    mixture = plan.num_epochs == 1 and hasattr(plan, "components")
    for epoch in range(plan.num_epochs):
        for k in range(plan.epoch_microbatches(epoch)):
            unit = explainer.unit(epoch, k)
            sample = plan.sample(k) if mixture else plan.sample(epoch, k)
            assert [row["document"] for row in unit["rows"]] == [int(d) for d in sample["documents"]]
            assert unit["loss_tokens"] == int(sample["loss_mask"].sum())
            last_label = int(sample["labels"][-1] != -100)  # the (L + 1)-th token, a label only
            assert unit["tokens"] == int((sample["segment_ids"] >= 0).sum()) + last_label
            if mixture:
                assert {row["component"] for row in unit["rows"]} == {sample["component_name"]}
                assert {row["component_epoch"] for row in unit["rows"]} == {sample["component_epoch"]}
    assert unit["tokens"] < 33 if name == "sequences" else unit["tokens"] == 33  # the padded tail, or a full one


@pytest.mark.parametrize("name", ["windowed", "sequences"])
def test_a_run_resumed_from_a_cursor_steps_from_it(built, name):
    """``start``: the cursor a run resumed from, at another world size: its steps are the resumed sampler's."""
    plan = open_plan(built[name])
    sequences = name == "sequences"
    report = explain(built[name], 0, count=total_steps(plan, 3, start=(0, 5)), world_size=3, start=(0, 5))
    assert report["steps"][0]["cursor"] == 5 and report["start"] == {"epoch": 0, "index": 5}
    for rank in range(3):
        if sequences:
            sampler = SequenceBatchSampler(built[name], 1, rank=rank, world_size=3, sample_index=5)
            got = [[(step["epoch"], u["index"]) for u in step["ranks"][rank]["units"]] for step in report["steps"]]
        else:
            sampler = PlanBatchSampler(built[name], rank=rank, world_size=3, microbatch_index=5)
            got = [keys_of(u, False) for step in report["steps"] for u in step["ranks"][rank]["units"]]
        assert [g for g in got if g] == sampler_passes(sampler, plan.num_epochs)


def test_the_command_prints_a_table_per_rank_and_the_json_schema(built, capsys):
    assert main(["plan", "explain", built["mixed"], "--step", "2:4", "--world-size", "2", "--rank", "1"]) == 0
    text = capsys.readouterr().out.splitlines()
    assert text[0].startswith(f"mixed plan {built['mixed']} (fingerprint ")
    assert text[1] == f"  world size 2: {total_steps(open_plan(built['mixed']), 2)} steps"
    assert [line for line in text if line.startswith("step ")] == ["step 2: epoch 0, cursor 4",
                                                                    "step 3: epoch 0, cursor 6"]
    assert sum(line.startswith("  rank 1, microbatch ") for line in text) == 2
    heading = next(line for line in text if line.lstrip().startswith("sample"))
    shown = [column for column in heading.split() if column != "row"]  # row: only where it is not doc
    assert shown == ["sample", "component", "c.epoch", "doc", "range", "tokens", "loss", "src"]
    assert main(["plan", "explain", built["mixed"], "--step", "2:4", "--world-size", "2", "--rank", "1",
                 "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert lines(report) == text
    assert report["format"] == "umlos_cuda.plan_explain/1" and report["origin"] == {"parent": None, "edits": []}
    assert set(report) == {"format", "plan", "kind", "fingerprint", "origin", "unit", "world_size", "batch_size",
                           "start", "run_steps", "steps"}
    unit = report["steps"][0]["ranks"][0]["units"][0]
    assert list(unit) == ["index", "bucket_id", "max_len", "window", "tokens", "loss_tokens", "rows"]
    assert all(tuple(row) == ROW_FIELDS for row in unit["rows"])
    assert unit["index"] == 5 and report["steps"][0]["ranks"][0]["rank"] == 1


@pytest.mark.parametrize("argv, code, words", [
    (["--step", "999999"], errors.PLAN_CURSOR_INVALID, "is past the plan's end"),
    (["--step", "0", "--world-size", "2", "--rank", "2"], errors.INVALID_RANK, "interval [0, 1]"),
    (["--step", "0", "--batch-size", "2"], errors.BATCHING_CONFIG_INVALID, "one microbatch per rank"),
    (["--step", "3:3"], errors.BATCHING_CONFIG_INVALID, "holds no step"),
    (["--step", "0", "--start", "5:0"], errors.PLAN_CURSOR_INVALID, "epoch 5 is not in the plan"),
    (["--step", "0", "--start", "0:99999"], errors.PLAN_CURSOR_INVALID, "past the end of epoch 0"),
])
def test_the_command_refuses_with_documented_codes(built, argv, code, words, capsys):
    assert main(["plan", "explain", built["windowed"], *argv]) == 2
    err = capsys.readouterr().err
    assert f"error {code}:" in err and words in err


def test_token_sources_given_must_hold_the_plan_s_rows(built):
    with pytest.raises(UmlosError) as caught:  # another store, 30 rows against the plan's 60
        StepExplainer.open(built["split"], tokens=built["b"])
    assert caught.value.code == errors.BATCH_STORE_MISMATCH
    with pytest.raises(UmlosError) as caught:
        StepExplainer.open(built["sequences"], tokens=built["a"])
    assert caught.value.code == errors.BATCHING_CONFIG_INVALID and "cut from" in caught.value.message
    with pytest.raises(UmlosError) as caught:  # a mixture takes one per component, in order
        StepExplainer.open(built["mixed"], tokens=[built["b"], built["a"]]).unit(0, 0)
    assert caught.value.code == errors.BATCH_STORE_MISMATCH and "component 0" in caught.value.message
    plain = explain(built["split"], 0)["steps"][0]["ranks"][0]["units"][0]
    assert plain["loss_tokens"] is None and all(row["source"] is None for row in plain["rows"])


def test_a_toy_kind_explains_itself_through_its_record(built, tmp_path, capsys):
    """A kind registered at run time with an ``explain`` in its record is explained like the built-in ones; a
    kind without one is refused naming those that have one."""
    import dataclasses

    import toy_plan_kind as toy
    from umlos_cuda.batching.sources import open_source

    if toy.KIND not in plan_kinds():
        register_plan_kind(toy.KIND)
    try:
        source = open_source(f"{built['a']}/lengths.jsonl")
        folder = toy.KIND.save(toy.ToyPlan(source, 7), tmp_path / "toy")
        capsys.readouterr()
        assert main(["plan", "explain", folder, "--step", "1", "--world-size", "3", "--rank", "2", "--json"]) == 0
        (unit,) = json.loads(capsys.readouterr().out)["steps"][0]["ranks"][0]["units"]
        assert unit["index"] == 5 and [row["document"] for row in unit["rows"]] == list(range(35, 42))
        assert unit["tokens"] == toy.open_toy(folder).tokens(5)
        with pytest.raises(UmlosError) as caught:
            StepExplainer(toy.open_toy(folder), dataclasses.replace(toy.KIND, explain=None), folder=folder)
        assert caught.value.code == errors.PLAN_NOT_FOUND
        assert "plan explain takes a plan, a windowed plan" in caught.value.message
    finally:
        unregister_plan_kind(toy.KIND.name)


# ---------------------------------------------------------------------- a run's steps on the checkpoint store's tape
def _lockstep(folder: str, world_size: int, cursor: tuple[int, int], steps: int):
    """``steps`` lockstep steps of ``world_size`` samplers from ``cursor``: ``(epoch, [(index, rows), ...])`` each,
    the rows each rank's sampler handed out (what ``PlanCollator`` puts in ``rows``), and the cursor after."""
    samplers = [PlanBatchSampler(folder, rank=r, world_size=world_size, epoch=cursor[0], microbatch_index=cursor[1])
                for r in range(world_size)]
    passes = [iter(s) for s in samplers]
    out = []
    for _ in range(steps):
        epoch = samplers[0].epoch
        units = []
        for sampler, handed in zip(samplers, passes):
            rows = next(handed, None)
            if rows is not None:
                units.append((sampler.last_microbatch["index"], rows))
        if not units:  # the epoch is done: the next one's pass, or the plan is done
            plan = samplers[0].plan
            if samplers[0].epoch == plan.num_epochs - 1 and \
                    samplers[0].microbatch_index == plan.epoch_microbatches(plan.num_epochs - 1):
                break
            passes = [iter(s) for s in samplers]
            continue
        out.append((epoch, units))
    return out, (samplers[0].epoch, samplers[0].microbatch_index)


def _record(store_dir: str, fingerprint: str, steps, *, first_t: int = 1, commit: bool = True) -> None:
    """Append ``steps`` to the store's tape as ``plan.step`` records (a new store: its run header first)."""
    from test_checkpoint_support import DATASET, KEY, identity

    from umlos_cuda.batching.plans.explain import step_record
    from umlos_cuda.checkpoint import CheckpointStore

    with CheckpointStore.open(store_dir, identity(), KEY) as store:
        if store.tape.event_count == 0:
            store.start_run(DATASET, world_size=3, task_type="training")
        for t, (epoch, units) in enumerate(steps, start=first_t):
            store.tape.append(step_record(t, fingerprint, epoch, units))
        if commit:
            store.commit()


def test_a_run_killed_and_resumed_at_another_world_size_checks_against_its_plan(built, tmp_path, capsys):
    """Steps at 3 ranks, 4 of them committed and 2 lost to a crash, then resumed at 2 ranks from the committed
    cursor to the plan's end: the committed tape holds every microbatch of both epochs once, its plan's rows."""
    from umlos_cuda.batching.plans.explain import check_tape

    folder, store = built["windowed"], str(tmp_path / "store")
    plan = open_plan(folder)
    done, cursor = _lockstep(folder, 3, (0, 0), 4)
    lost, _ = _lockstep(folder, 3, cursor, 2)
    _record(store, plan.fingerprint, done)
    _record(store, plan.fingerprint, lost, first_t=5, commit=False)  # closed uncommitted: gone, as after a crash
    rest, end = _lockstep(folder, 2, cursor, 10 ** 4)
    _record(store, plan.fingerprint, rest, first_t=5)
    assert end == (1, plan.epoch_microbatches(1))
    report = check_tape(store, StepExplainer.open(folder))
    assert report["units"] == sum(plan.epoch_microbatches(e) for e in range(2))
    assert report["steps"] == 4 + len(rest) and report["last"] == {"t": 4 + len(rest), "epoch": 1,
                                                                   "cursor": plan.epoch_microbatches(1)}
    capsys.readouterr()
    assert main(["plan", "explain", folder, "--check-tape", store]) == 0
    assert capsys.readouterr().out.startswith(f"tape {store}: {report['steps']} steps (t 1 to {report['steps']}), "
                                              f"{report['units']} microbatches from epoch 0 unit 0 to epoch 1 unit")


@pytest.mark.parametrize("change, words", [
    (lambda steps: [(e, [(i, rows[::-1] if k == 0 and n == 2 else rows) for k, (i, rows) in enumerate(units)])
                    for n, (e, units) in enumerate(steps)], "trained other rows than the plan gives"),
    (lambda steps: steps[:2] + steps[3:], "skipped or repeated"),
    (lambda steps: steps[:3] + steps[2:], "skipped or repeated"),
    (lambda steps: [], "holds no plan.step record"),
])
def test_a_tape_that_differs_from_its_plan_is_refused_naming_the_step(built, tmp_path, change, words, capsys):
    folder, store = built["windowed"], str(tmp_path / "store")
    steps, _ = _lockstep(folder, 3, (0, 0), 5)
    assert len(steps[2][1][0][1]) > 1  # the step whose first rows the first case reverses has several
    _record(store, open_plan(folder).fingerprint, change(steps))
    assert main(["plan", "explain", folder, "--check-tape", store]) == 2
    err = capsys.readouterr().err
    assert "error PLAN_TAPE_MISMATCH:" in err and words in err


def test_a_tape_of_another_plan_is_refused(built, tmp_path, capsys):
    store = str(tmp_path / "store")
    steps, _ = _lockstep(built["windowed"], 1, (0, 0), 2)
    _record(store, open_plan(built["windowed"]).fingerprint, steps)
    assert main(["plan", "explain", built["windowed packed"], "--check-tape", store]) == 2
    err = capsys.readouterr().err
    assert "PLAN_TAPE_MISMATCH" in err and "was trained on plan" in err
    assert main(["plan", "explain", built["windowed"], "--check-tape", store, "--step", "0"]) == 2
    assert "--step does not apply" in capsys.readouterr().err


def test_a_run_from_the_plan_s_end_has_no_step(built):
    plan = open_plan(built["windowed"])
    end = (1, plan.epoch_microbatches(1))
    with pytest.raises(UmlosError) as caught:
        explain(built["windowed"], 0, start=end)
    assert caught.value.code == errors.PLAN_CURSOR_INVALID and "the run has no step" in caught.value.message
    with pytest.raises(UmlosError) as caught:
        explain(StepExplainer.open(built["windowed"]), 0, tokens=built["a"])
    assert caught.value.code == errors.BATCHING_CONFIG_INVALID
