"""Conversational preference data against TRL: ``data tokenize`` and TRL's ``DPOTrainer`` and ``KTOTrainer``
tokenize the same records to the same rows, token for token and mask for mask.

Each form TRL takes (pairs with a prompt, implicit-prompt pairs, unpaired KTO records) is generated on
four template families (tests/preference_cases.py: ChatML, ``{% generation %}``, Zephyr and a thinking
template whose prompt alone is no prefix of the finished turn), with string content and with text parts,
and tokenized by the token store writer and by TRL's own ``_prepare_dataset`` and collators. The table of
rows compared and rows equal is what docs/performance.md reports (``python tests/test_batching_preference_trl.py``
prints it for more records; ``--time`` times both on 20,000 pairs). Then: the length cache counts the store's
rows, Parquet gives the JSONL's store, unpaired labels come back from the ids, the implicit prompt's corner
cases are TRL's, string unpaired records are prompt/response rows, and each refusal is documented.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from batching_cases import expect, train_tokenizer, write_model_dir
from preference_cases import FAMILIES, FIELDS, FORMS, equality, family_models, records, trl_rows, write_jsonl
from umlos_cuda import errors
from umlos_cuda.batching import (LengthCache, TokenStore, build_lengths, dataset_fingerprint, sft_sample,
                                 unpaired_labels)
from umlos_cuda.batching.chat.preference import split_prompt
from umlos_cuda.batching.lengths.pairs import holds_pairs
from umlos_cuda.batching.records.chunk import SkippedLines
from umlos_cuda.batching.samples import SampleMeta
from umlos_cuda.batching.tokens.writer import tokenize_dataset
from umlos_cuda.cli import main

transformers = pytest.importorskip("transformers")
pytest.importorskip("trl")
pytest.importorskip("datasets")

#: (family, text parts) pairs of the equality table: every family with strings, the two that read parts with parts.
CONTENTS = [(family, False) for family in FAMILIES] + [(family, True) for family, spec in FAMILIES.items() if spec[3]]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return family_models(tmp_path_factory.mktemp("preference-models"))


def tokenized(models, family, form, rows, folder, **options):
    write_jsonl(folder / "data.jsonl", rows)
    return tokenize_dataset(folder / "data.jsonl", models[family][0], folder / "store", conversational=True,
                            **FIELDS[form], **options)


@pytest.mark.parametrize("family, parts", CONTENTS)
@pytest.mark.parametrize("form", FORMS)
def test_rows_equal_trls(models, family, parts, form, tmp_path):
    rows = records(form, 40, seed=len(family) + 7 * parts, parts=parts)
    store = tokenized(models, family, form, rows, tmp_path)
    expected = trl_rows(form, rows, models[family][1])
    compared, equal = equality(store, expected)
    assert (compared, equal) == (len(expected), len(expected))
    assert store.meta["loss_mask"] == "completion"
    per_record = 1 if form == "unpaired" else 2
    assert len(store) == per_record * len(rows)
    assert any(mask.count(1) for _ids, mask in expected)  # the rows train on something


def test_the_thinking_template_starts_completions_where_trl_does(models, tmp_path):
    """The prompt alone ends with an empty thought block the finished turn lacks: the completion starts
    where the tokens first differ, before the prompt's own end, as TRL's common prefix says."""
    _folder, hf = models["thinking"]
    rows = records("pairs", 20, seed=3)
    store = tokenized(models, "thinking", "pairs", rows, tmp_path)
    for row in range(len(store)):
        record = rows[row // 2]
        prompt = hf.apply_chat_template(record["prompt"], add_generation_prompt=True, return_dict=True)["input_ids"]
        ids, mask = store.arrays(row)
        start = int(np.argmax(mask)) if mask.any() else len(mask)
        assert start < len(prompt)  # not the prompt's token count
        assert ids[:start].tolist() == prompt[:start]


def test_the_length_cache_counts_the_stores_rows(models, tmp_path):
    rows = records("implicit", 30, seed=5)
    store = tokenized(models, "chatml", "implicit", rows, tmp_path)
    cache = build_lengths(tmp_path / "data.jsonl", models["chatml"][0], tmp_path / "lengths.jsonl",
                          conversational=True, **FIELDS["implicit"])
    assert np.array_equal(cache.lengths, store.lengths)
    assert list(cache.sample_ids) == [f"r{i}/{side}" for i in range(30) for side in ("chosen", "rejected")]
    assert holds_pairs(cache.sample_ids) and cache.dataset_hash == store.dataset_hash
    assert dataset_fingerprint(tmp_path / "data.jsonl", store.tokenizer_hash, conversational=True,
                               **FIELDS["implicit"]) == store.dataset_hash


def test_the_store_is_the_same_for_every_chunk_size_and_worker_count(models, tmp_path):
    rows = records("pairs", 30, seed=8, parts=True)
    one = tokenized(models, "chatml", "pairs", rows, tmp_path)
    many = tokenize_dataset(tmp_path / "data.jsonl", models["chatml"][0], tmp_path / "many", conversational=True,
                            chunk_size=7, workers=2, **FIELDS["pairs"])
    for name in ("tokens_sha256", "loss_mask_sha256", "offsets_sha256", "dataset_hash"):
        assert many.meta[name] == one.meta[name], name


@pytest.mark.parametrize("form", FORMS)
def test_parquet_gives_the_jsonl_store(models, form, tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    rows = records(form, 25, seed=11, parts=True)
    from_jsonl = tokenized(models, "generation", form, rows, tmp_path)
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "data.parquet")
    from_parquet = tokenize_dataset(tmp_path / "data.parquet", models["generation"][0], tmp_path / "pq-store",
                                    conversational=True, **FIELDS[form])
    for name in ("tokens_sha256", "loss_mask_sha256", "offsets_sha256", "dataset_hash", "tokenizer_hash"):
        assert from_parquet.meta[name] == from_jsonl.meta[name], name
    assert list(from_parquet.length_cache().sample_ids) == list(from_jsonl.length_cache().sample_ids)


def test_unpaired_labels_come_back_from_the_ids(models, tmp_path):
    rows = records("unpaired", 30, seed=2)
    store = tokenized(models, "zephyr", "unpaired", rows, tmp_path)
    ids = list(store.length_cache().sample_ids)
    assert ids == [f"r{i}/{'desirable' if row['label'] else 'undesirable'}" for i, row in enumerate(rows)]
    assert unpaired_labels(ids).tolist() == [row["label"] for row in rows]
    expect(errors.LENGTHS_INVALID, unpaired_labels, ["r0/desirable", "r1/chosen"], mention="r1/chosen")


def test_string_unpaired_records_are_prompt_response_rows(tmp_path):
    model = write_model_dir(tmp_path / "model", train_tokenizer(), {"eos_token": "</s>"})
    rows = [{"id": "a", "q": "the quick fox", "c": "jumps over", "ok": True},
            {"id": "b", "q": "why is python", "c": "what it is", "ok": False}]
    write_jsonl(tmp_path / "kto.jsonl", rows)
    store = tokenize_dataset(tmp_path / "kto.jsonl", model, tmp_path / "store", prompt_field="q",
                             completion_field="c", label_field="ok")
    assert list(store.length_cache().sample_ids) == ["a/desirable", "b/undesirable"]
    assert store.meta["loss_mask"] == "template"
    for row, record in enumerate(rows):
        sample = sft_sample(model, record["q"], record["c"], SampleMeta(record["id"], "kto"))
        ids, mask = store.arrays(row)
        assert ids.tolist() == list(sample.input_ids) and mask.tolist() == list(sample.loss_mask)


def test_the_implicit_prompt_is_trls_extract_prompt():
    from trl.data_utils import extract_prompt

    user, other = {"role": "user", "content": "a"}, {"role": "user", "content": "b"}
    good, bad = {"role": "assistant", "content": "x"}, {"role": "assistant", "content": "y"}
    cases = [([user, good], [user, bad]), ([user, good, other, good], [user, good, other, bad]),
             ([user, good], [user, good]),  # the same: the cut falls before the last message
             ([user, good, other, good], [user, good]), ([user, good], [user, good, other, bad]),
             ([user, {**good, "name": None}], [user, good])]  # a null key is a missing one, as in datasets
    for chosen, rejected in cases:
        trl = extract_prompt({"chosen": chosen, "rejected": rejected})
        assert split_prompt(chosen, rejected) == (trl["prompt"], trl["chosen"], trl["rejected"])


def test_refused_records_name_their_line_or_are_skipped(models, tmp_path):
    folder = models["chatml"][0]
    good = records("pairs", 3, seed=1)
    bad = [{"id": "x1", "prompt": "not a list", "chosen": good[0]["chosen"], "rejected": good[0]["rejected"]},
           {"id": "x2", "prompt": good[0]["prompt"], "chosen": [["assistant", "hi"]], "rejected": good[0]["chosen"]},
           {"id": "x3", "prompt": [{"role": "user", "content": [{"type": "image", "url": "a.png"}]}],
            "chosen": good[0]["chosen"], "rejected": good[0]["rejected"]}]
    write_jsonl(tmp_path / "d.jsonl", [good[0], *bad, *good[1:]])
    options = dict(conversational=True, **FIELDS["pairs"])
    error = expect(errors.DATASET_RECORD_INVALID, tokenize_dataset, tmp_path / "d.jsonl", folder, tmp_path / "s",
                   **options)
    assert "line 2" in error.message and "'prompt'" in error.message and "--skip-bad-lines" in error.message
    skipped = SkippedLines()
    store = tokenize_dataset(tmp_path / "d.jsonl", folder, tmp_path / "s", skipped=skipped, **options)
    assert skipped.count == 3 and len(store) == 6
    assert [message.split(" ", 2)[1:2] for message in skipped.first] == [["line"]] * 3
    assert "line 4" in skipped.first[2] and "only text parts" in skipped.first[2]
    assert list(store.length_cache().sample_ids)[:2] == ["r0/chosen", "r0/rejected"]
    only_image = tmp_path / "image.jsonl"
    write_jsonl(only_image, [bad[2]])
    expect(errors.CHAT_CONTENT_UNSUPPORTED, tokenize_dataset, only_image, folder, tmp_path / "s2", **options)
    expect(errors.DATASET_EMPTY, tokenize_dataset, only_image, folder, tmp_path / "s2", skipped=SkippedLines(),
           **options)

    no_prompt = tmp_path / "np.jsonl"
    write_jsonl(no_prompt, [{"chosen": good[0]["chosen"], "rejected": good[0]["rejected"]}])
    error = expect(errors.DATASET_RECORD_INVALID, tokenize_dataset, no_prompt, folder, tmp_path / "s3",
                   conversational=True, **FIELDS["implicit"])
    assert "share no first message" in error.message

    unlabeled = tmp_path / "kto.jsonl"
    write_jsonl(unlabeled, [{"prompt": good[0]["prompt"], "completion": good[0]["chosen"], "label": "yes"}])
    error = expect(errors.DATASET_RECORD_INVALID, tokenize_dataset, unlabeled, folder, tmp_path / "s4",
                   conversational=True, **FIELDS["unpaired"])
    assert "'label'" in error.message and "true or false" in error.message
    write_jsonl(unlabeled, [{"prompt": good[0]["prompt"], "completion": good[0]["chosen"]}])
    error = expect(errors.DATASET_RECORD_INVALID, tokenize_dataset, unlabeled, folder, tmp_path / "s4",
                   conversational=True, **FIELDS["unpaired"])
    assert "lacks the field 'label'" in error.message


def test_a_template_refusal_is_a_bad_record(models, tmp_path):
    template = "{% if messages[-1]['role'] == 'assistant' %}{{ raise_exception('no answers here') }}{% endif %}x"
    (tmp_path / "t.jinja").write_text(template, encoding="utf-8")
    write_jsonl(tmp_path / "d.jsonl", records("pairs", 2, seed=1))
    error = expect(errors.DATASET_RECORD_INVALID, tokenize_dataset, tmp_path / "d.jsonl", models["chatml"][0],
                   tmp_path / "s", conversational=True, chat_template=tmp_path / "t.jinja", **FIELDS["pairs"])
    assert "no answers here" in error.message and "line 1" in error.message


def test_options_that_do_not_go_together_are_refused(models, tmp_path):
    write_jsonl(tmp_path / "d.jsonl", records("pairs", 2, seed=1))
    folder = models["chatml"][0]
    for options in ({"chosen_field": "chosen", "rejected_field": "rejected"},  # an implicit prompt needs conversations
                    {"prompt_field": "prompt", "chosen_field": "chosen", "completion_field": "chosen",
                     "label_field": "l", "rejected_field": "rejected"},
                    {"prompt_field": "prompt", "completion_field": "chosen"},
                    {"conversational": True, "messages_field": "chosen"},
                    {"conversational": True, "text_field": "prompt", "chosen_field": "chosen",
                     "rejected_field": "rejected"},
                    {"conversational": True, "length_field": "n"}):
        expect(errors.LENGTHS_INVALID, build_lengths, tmp_path / "d.jsonl", folder, tmp_path / "l.jsonl", **options)
    assert not (tmp_path / "l.jsonl").exists()


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_cli_tokenizes_each_form(models, capsys, tmp_path):
    folder = models["chatml"][0]
    for form in FORMS:
        write_jsonl(tmp_path / f"{form}.jsonl", records(form, 6, seed=4))
        flags = [item for key, value in FIELDS[form].items() for item in (f"--{key.replace('_', '-')}", value)]
        code, out, err = run(capsys, "data", "tokenize", "--dataset", tmp_path / f"{form}.jsonl", "--tokenizer",
                             folder, "--output", tmp_path / form, "--conversational", "--quiet", "--workers", "1",
                             *flags)
        assert code == 0, err
        assert len(TokenStore.open(tmp_path / form)) == 6 * (1 if form == "unpaired" else 2)
    code, out, err = run(capsys, "plan", "build", "--lengths", tmp_path / "implicit" / "lengths.jsonl",
                         "--bucket-edges", "64,128", "--overflow-max", "512", "--token-budget", "2048",
                         "--output", tmp_path / "plan", "--quiet")
    assert code == 0 and "preference pairs: 6 pairs" in out, err
    base = ("data", "lengths", "build", "--dataset", tmp_path / "pairs.jsonl", "--tokenizer", folder, "--output",
            tmp_path / "l.jsonl", "--quiet")
    for argv in (("--chosen-field", "chosen", "--rejected-field", "rejected"),
                 ("--conversational", "--prompt-field", "prompt"),
                 ("--prompt-field", "prompt", "--completion-field", "chosen"),
                 ("--chat-template", tmp_path / "t.jinja", "--text-field", "prompt")):
        with pytest.raises(SystemExit) as exit_info:
            run(capsys, *base, *argv)
        assert exit_info.value.code == 2
        assert "--conversational" in capsys.readouterr().err or argv[0] != "--chosen-field"
    assert not (tmp_path / "l.jsonl").exists()
    json.loads((tmp_path / "pairs" / "meta.json").read_text())  # the store's meta is plain JSON
    cache = LengthCache.load(tmp_path / "unpaired" / "lengths.jsonl")
    assert all(sample_id.endswith(("/desirable", "/undesirable")) for sample_id in cache.sample_ids)


def table(count: int = 2000) -> str:
    """The equality table of docs/performance.md: each form on each family, ``count`` records a cell."""
    import tempfile
    from pathlib import Path

    lines = ["| record form | template family | content | rows compared | rows equal |", "|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as root:
        base = Path(root)
        found = family_models(base)
        for form in FORMS:
            for family, parts in CONTENTS:
                folder = base / f"{form}-{family}-{parts}"
                folder.mkdir()
                rows = records(form, count, seed=100 + len(family), parts=parts)
                store = tokenized(found, family, form, rows, folder)
                compared, equal = equality(store, trl_rows(form, rows, found[family][1]))
                lines.append(f"| {form} | {family} | {'text parts' if parts else 'string'} | {compared:,} | "
                             f"{equal:,} |")
    return "\n".join(lines)


def timing(count: int = 20000, rounds: int = 3) -> str:
    """Seconds of ``tokenize_dataset`` (one worker) and of TRL's ``DPOTrainer._prepare_dataset`` (its
    ``datasets.Dataset`` built in the clock) on ``count`` conversational pairs of the ChatML family."""
    import tempfile
    import time
    from pathlib import Path
    from types import SimpleNamespace

    import datasets
    from datasets import Dataset
    from trl.trainer.dpo_trainer import DPOTrainer

    datasets.disable_progress_bars()
    lines = []
    with tempfile.TemporaryDirectory() as root:
        base = Path(root)
        folder, hf = family_models(base)["chatml"]
        rows = records("pairs", count, seed=1)
        write_jsonl(base / "data.jsonl", rows)
        trainer = SimpleNamespace(_tokenizer=hf)
        args = SimpleNamespace(dataset_num_proc=None, max_length=None, truncation_mode="keep_start")
        for _ in range(rounds):
            start = time.perf_counter()
            tokenize_dataset(base / "data.jsonl", folder, base / "store", conversational=True, force=True, workers=1,
                             **FIELDS["pairs"])
            ours = time.perf_counter() - start
            start = time.perf_counter()
            dataset = Dataset.from_list([{key: value for key, value in row.items() if key != "id"} for row in rows])
            DPOTrainer._prepare_dataset(trainer, dataset, hf, args, "eval")
            lines.append(f"{count} pairs: data tokenize {ours:.1f} s, TRL {time.perf_counter() - start:.1f} s")
    return "\n".join(lines)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--time"]:
        print(timing(int(sys.argv[2]) if len(sys.argv) > 2 else 20000))
    else:
        print(table(int(sys.argv[1]) if len(sys.argv) > 1 else 2000))
