"""A weighted mixture of SFT datasets to tensors: a mixed plan's microbatches are rows of its components read one
after another, so ``PlanBatchSampler``, ``TokenDataset(plan.dataset())``, ``PlanCollator`` and the Trainer take it
as they take a plan of one dataset -- every sample the tokens of the component row its id names, the same global
sequence at any world size, a resume exact, and a Trainer run stopped and resumed bit-identical to one that was not.
``batch generate`` writes it as batch files (one token store per component) that hold exactly what the torch path
collates, and ``batch check`` refuses a component's store that is not the one the files were collated from, naming
the component.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from token_cases import make_store, swapped_vocabulary  # noqa: E402

from umlos_cuda import errors  # noqa: E402
from umlos_cuda.batching.batches.fingerprint import fingerprint_plan_batches  # noqa: E402
from umlos_cuda.batching.batches.reader import BatchReader  # noqa: E402
from umlos_cuda.batching.collate import CollatedBatch  # noqa: E402
from umlos_cuda.batching.plans.kinds import open_plan, plan_kind_of  # noqa: E402
from umlos_cuda.batching.plans.rows import open_row_source  # noqa: E402
from umlos_cuda.batching.presets import apply_preset  # noqa: E402
from umlos_cuda.batching.tokens.writer import tokenize_dataset  # noqa: E402
from umlos_cuda.batching.tokens.store import TokenStore  # noqa: E402
from umlos_cuda.cli import main  # noqa: E402
from umlos_cuda.errors import UmlosError  # noqa: E402
from umlos_cuda.torch import PlanBatchSampler, PlanCollator, TokenDataset  # noqa: E402

BUDGET = ("--bucket-edges", "32,64,128", "--overflow-max", "256", "--token-budget", "512", "--quiet")


@pytest.fixture(scope="module")
def mixed(tmp_path_factory) -> dict:
    """Two SFT token stores (one tokenizer) and a mixed plan of 600 samples over them, 0.7 and 0.3 (the second
    capped at 4 epochs), in windows of 32; and the same mixture over the stores' length caches."""
    root = tmp_path_factory.mktemp("mixed-sft")
    chat = str(make_store(root / "a", 60, seed=3).root)
    code = str(make_store(root / "b", 40, seed=9).root)
    plan = str(root / "plan")
    assert main(["plan", "build", "--window", "32", "--mix", f"{chat}:0.7", f"{code}:0.3:4", "--num-samples", "600",
                 "--seed", "5", *BUDGET, "--output", plan]) == 0
    lengths_only = str(root / "lengths-plan")
    assert main(["plan", "build", "--window", "32", "--mix", f"{chat}/lengths.jsonl:0.7",
                 f"{code}/lengths.jsonl:0.3:4", "--num-samples", "600", "--seed", "5", *BUDGET,
                 "--output", lengths_only]) == 0
    return {"root": root, "stores": {"a": chat, "b": code}, "plan": plan, "lengths-only": lengths_only}


def _component_rows(spec) -> list[tuple[int, int]]:
    """(component, row) of each sample id ``name:row`` (the fixture's components are named after their folders)."""
    names = ["store0", "store1"]
    return [(names.index(name), int(row)) for name, row in (sample.rsplit(":", 1) for sample in spec.samples)]


def test_rows_index_the_components_read_one_after_another(mixed):
    plan = open_plan(mixed["plan"])
    stores = [TokenStore.open(mixed["stores"][key]) for key in ("a", "b")]
    assert plan.definition.starts.tolist() == [0, len(stores[0]), len(stores[0]) + len(stores[1])]
    dataset = TokenDataset(plan.dataset())
    assert len(dataset) == len(stores[0]) + len(stores[1])
    seen = 0
    for _, spec in plan.iter_from(0):
        for row, (component, own) in zip(spec.rows.tolist(), _component_rows(spec)):
            assert row == int(plan.definition.starts[component]) + own
            got, mask = dataset[row][1:]
            want, want_mask = stores[component].arrays(own)
            assert np.array_equal(got, want) and np.array_equal(mask, want_mask)
            seen += 1
    assert seen == plan.counts()["samples"] > 0


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_the_ranks_deal_out_the_mixture_s_global_sequence(mixed, world_size):
    plan = open_plan(mixed["plan"])
    want = [spec.rows.tolist() for _, spec in plan.iter_from(0)]
    ranks = [list(PlanBatchSampler(mixed["plan"], rank=r, world_size=world_size)) for r in range(world_size)]
    assert all(ranks[r] == want[r::world_size] for r in range(world_size))


def test_a_stopped_sampler_resumes_at_another_world_size(mixed):
    plan = open_plan(mixed["plan"])
    want = [spec.rows.tolist() for _, spec in plan.iter_from(0)]
    first = PlanBatchSampler(mixed["plan"], rank=0, world_size=1)
    taken = []
    for rows in first:
        taken.append(rows)
        if len(taken) == 7:
            break
    state = json.loads(json.dumps(first.state_dict()))
    resumed = []
    for rank in range(2):
        sampler = PlanBatchSampler(mixed["plan"], rank=rank, world_size=2)
        sampler.load_state_dict(state)
        resumed.append(list(sampler))
    queues = [iter(rows) for rows in resumed]  # global microbatch i >= 7 is rank i % 2's
    merged = [next(queues[i % 2]) for i in range(7, len(want))]
    assert taken + merged == want and all(next(queue, None) is None for queue in queues)


def test_a_data_loader_collates_the_mixture(mixed):
    plan = open_plan(mixed["plan"])
    loader = torch.utils.data.DataLoader(TokenDataset(plan.dataset()), batch_sampler=PlanBatchSampler(plan, 0, 1),
                                         collate_fn=PlanCollator(plan))
    for (_, spec), batch in zip(plan.iter_from(0), loader):
        assert batch["rows"].tolist() == spec.rows.tolist()
        assert batch["input_ids"].shape[0] == len(spec.samples)


def test_a_mixture_planned_from_lengths_names_what_it_lacks(mixed):
    plan = open_plan(mixed["lengths-only"])
    assert list(PlanBatchSampler(plan, 0, 1))  # the rows are there: any dataset of the same rows serves
    with pytest.raises(UmlosError) as caught:
        plan.dataset()
    assert caught.value.code == errors.TOKEN_STORE_NOT_FOUND and "'lengths0'" in caught.value.message
    same = TokenDataset([mixed["stores"]["a"], mixed["stores"]["b"]])  # given by hand, in component order
    assert np.array_equal(same[60][1], TokenStore.open(mixed["stores"]["b"]).arrays(0)[0])


def test_plan_shard_says_why_not_a_mixture(mixed, tmp_path, capsys):
    assert main(["plan", "shard", mixed["plan"], "--world-size", "2", "--output", str(tmp_path / "s")]) == 2
    err = capsys.readouterr().err
    assert "PLAN_NOT_FOUND" in err and "several datasets'" in err and "windowed plan" in err


def _generate(mixed, out, *extra) -> None:
    stores = [mixed["stores"]["a"], mixed["stores"]["b"]]
    assert main(["batch", "generate", "--plan", mixed["plan"], "--source", *stores, "--output", str(out),
                 "--workers", "2", "--quiet", *extra]) == 0


@pytest.mark.parametrize("layout", ["compact", "npz", "index"])
def test_batch_generate_writes_what_the_torch_path_collates(mixed, tmp_path, capsys, layout):
    """Each microbatch of the mixture, as ``PlanBatchSampler`` + ``TokenDataset(plan.dataset())`` + ``PlanCollator``
    give it, is exactly what the batch folder's reader hands out (the same tensors under the collator's preset,
    the same rows and ids); the folder names its plan's kind and each component's token source, and keeps the
    mixed plan, which reopens its lengths from those stores."""
    plan = open_plan(mixed["plan"])
    out = tmp_path / "batches"
    _generate(mixed, out, "--layout", layout)
    stores = [mixed["stores"]["a"], mixed["stores"]["b"]]
    index = json.loads((out / "batches.json").read_text())
    assert (index["format"], index["plan_kind"], index["layout"]) == ("umlos_cuda.batch_files/3", "mixed plan", layout)
    assert [(s["name"], s["path"], s["lengths"]) for s in index["sources"]] == \
        [(part.name, store, part.binding) for part, store in zip(plan.row_parts(), stores)]
    assert all(s["identity"]["tokens_sha256"] for s in index["sources"])
    assert index["token_dtype"] == ("<u2" if layout == "compact" else None)  # both stores' vocabularies fit 16 bits
    assert plan_kind_of(out / "plan").name == "mixed plan" and open_plan(out / "plan").fingerprint == plan.fingerprint
    reader = BatchReader(out, store=stores if layout == "index" else None)
    assert len(reader) == plan.num_microbatches and reader.plan_fingerprint == plan.fingerprint
    collator = PlanCollator(plan)
    loader = torch.utils.data.DataLoader(TokenDataset(plan.dataset()), batch_sampler=PlanBatchSampler(plan, 0, 1),
                                         collate_fn=collator)
    seen = 0
    for (index_, spec), batch, files in zip(plan.iter_from(0), loader, reader.iter_epoch(0)):
        assert int(files["index"]) == index_ and files["sample_ids"].tolist() == list(spec.samples)
        assert files["rows"].tolist() == batch["rows"].tolist() == spec.rows.tolist()
        tensors = apply_preset(CollatedBatch.from_dict(files), **collator.options)
        assert sorted(tensors) == sorted(name for name in batch if name != "rows")
        for name, value in tensors.items():
            assert np.array_equal(value, batch[name].numpy()), name
        seen += 1
    assert seen == plan.num_microbatches > 10
    assert reader.fingerprint == fingerprint_plan_batches(plan, open_row_source(plan, stores))
    capsys.readouterr()
    assert main(["batch", "check", str(out), "--source", *stores]) == 0
    assert f"match plan {plan.fingerprint} and the token store" in capsys.readouterr().out
    assert main(["batch", "fingerprint", "--plan", mixed["plan"], "--source", *stores]) == 0
    assert f"batch fingerprint {reader.fingerprint.fingerprint}" in capsys.readouterr().out
    _generate(mixed, out, "--layout", layout)  # a second run of the same job keeps the folder
    assert BatchReader(out, store=stores if layout == "index" else None).fingerprint == reader.fingerprint


def test_a_component_store_that_is_not_the_one_is_refused_by_name(mixed, tmp_path, capsys):
    """At generation, stores given in the wrong order or too few are refused before anything is written; at a
    check, a component's store tokenized again in place (the same lengths, other ids) is named, component and
    hashes, while the files themselves still read without a store."""
    a, b = mixed["stores"]["a"], mixed["stores"]["b"]
    capsys.readouterr()
    for stores, mention in (([b, a], "component 0 ('store0') of the plan: " + b),
                            ([a], "give one token source for each")):
        assert main(["batch", "generate", "--plan", mixed["plan"], "--source", *stores, "--output",
                     str(tmp_path / "wrong"), "--quiet"]) == 2
        err = capsys.readouterr().err
        assert "BATCH_STORE_MISMATCH" in err and mention in err, err
    assert not (tmp_path / "wrong").exists()
    root = mixed["root"]
    shutil.copytree(root / "b", tmp_path / "b")
    copy = str(tmp_path / "b" / "store")
    out = tmp_path / "batches"
    assert main(["batch", "generate", "--plan", mixed["plan"], "--source", a, copy, "--output", str(out),
                 "--quiet"]) == 0
    recorded = json.loads((out / "batches.json").read_text())["sources"][1]
    assert recorded["path"] == copy and json.loads((out / "plan" / "meta.json").read_text())["lengths_paths"] == \
        [a, copy]  # the copy of the plan reopens its lengths from the stores its files came from
    other = swapped_vocabulary(tmp_path / "b" / "model", tmp_path / "other-model")
    tokenize_dataset(tmp_path / "b" / "train.jsonl", other, copy, prompt_field="prompt", response_field="response",
                     force=True)
    capsys.readouterr()
    assert main(["batch", "check", str(out), "--source", a, copy]) == 2
    err = capsys.readouterr().err
    assert "BATCH_STORE_MISMATCH" in err and f"component 1 ('store1')'s token source {copy} is not the one" in err
    assert "tokens_sha256" in err and "tokenizer_hash" in err
    assert main(["batch", "check", str(out)]) == 0  # without a store: the files against their plan and digests
    with pytest.raises(UmlosError) as caught:
        BatchReader(out).verify([a, copy])
    assert caught.value.code == errors.BATCH_STORE_MISMATCH and copy in caught.value.message


@pytest.mark.filterwarnings("ignore:`gradient_checkpointing` is deprecated:FutureWarning")
def test_the_trainer_trains_on_the_mixture_and_resumes_it_exactly(mixed):
    """The Trainer's data source with no store: the mixed plan's own components. A run stopped at step 10 and
    resumed trains on the same microbatches, with bit-identical losses, as the run that was not stopped."""
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from trainer_cases import records, train

    root, plan = mixed["root"], mixed["plan"]
    kwargs = {"store": None, "plan": plan}
    train(**kwargs, output_dir=str(root / "whole"), record=str(root / "whole.jsonl"))
    train(**kwargs, output_dir=str(root / "cut"), record=str(root / "cut.jsonl"), stop_at=10)
    train(**kwargs, output_dir=str(root / "cut"), record=str(root / "resumed.jsonl"), resume=True)
    want = records(str(root / "whole.jsonl"))
    assert len(want) >= 40
    assert records(str(root / "cut.jsonl")) == want[:20]
    assert records(str(root / "resumed.jsonl")) == [line for line in want if line["step"] > 10]


def test_a_mixed_validation_plan_evaluates_from_the_stores_it_records(mixed):
    """PlanEvalData takes a mixed plan alone, as PlanTrainerData does: each real batch is the plan's microbatch of
    component rows, collated from the stores the plan records."""
    from umlos_cuda.torch.trainer import EVAL_PADDING, PlanEvalData

    plan = open_plan(mixed["plan"])
    data = PlanEvalData(mixed["plan"], rank=0, world_size=1)
    assert data.microbatches == plan.epoch_microbatches(0) > 0
    stores = [TokenStore.open(mixed["stores"][key]) for key in ("a", "b")]
    first = next(iter(data))
    batch = data.collate_fn([data.dataset[key] for key in first])
    assert batch[EVAL_PADDING] is False
    _, spec = next(iter(plan.iter_from(0)))
    want = [stores[component].arrays(own)[0] for component, own in _component_rows(spec)]
    got = batch["input_ids"][batch["attention_mask"].bool()] if batch["input_ids"].dim() == 2 else None
    assert got is not None and np.array_equal(got.numpy(), np.concatenate(want))
