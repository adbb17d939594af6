"""``umlos-cuda data lengths build|stats`` end to end, on a tokenizer trained
by the tests (tests/batching_cases.py): the files, the printed
statistics, and the exit status and code of every failure."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from batching_cases import corpus, train_tokenizer, write_model_dir
from umlos_cuda import errors
from umlos_cuda.batching import LengthCache, dataset_fingerprint, tokenizer_fingerprint
from umlos_cuda.batching.lengths.stats import optimal_bucket_choices, percentiles
from umlos_cuda.cli import main


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer()


@pytest.fixture
def workspace(tmp_path, tokenizer):
    write_model_dir(tmp_path / "model", tokenizer, {"eos_token": "</s>"})
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    texts = corpus(500, seed=11)
    with open(tmp_path / "train.jsonl", "w", encoding="utf-8") as handle:
        for i, text in enumerate(texts):
            handle.write(json.dumps({"id": f"train_{i:05d}", "text": text, "prompt": text[:10],
                                     "response": text[10:]}) + "\n")
    return tmp_path


def run(capsys, *argv):
    code = main([str(arg) for arg in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_build_then_stats(workspace, tokenizer, capsys):
    code, out, err = run(capsys, "data", "lengths", "build", "--dataset", workspace / "train.jsonl",
                         "--tokenizer", workspace / "model", "--output", workspace / "lengths.jsonl")
    assert code == 0, err
    cache = LengthCache.load(workspace / "lengths.jsonl", sidecar="require")
    texts = corpus(500, seed=11)
    assert cache.lengths.tolist() == [len(tokenizer.encode(t)) for t in texts]
    assert cache.sample_ids == [f"train_{i:05d}" for i in range(500)]
    with open(workspace / "lengths.jsonl") as handle:
        rows = [json.loads(line) for line in handle]
    assert list(rows[0]) == ["sample_id", "tokenizer_hash", "length"]
    assert {row["tokenizer_hash"] for row in rows} == {tokenizer_fingerprint(workspace / "model")}
    assert f"{len(texts)} samples" in out and "samples/s" in out
    assert f"dataset_hash {dataset_fingerprint(workspace / 'train.jsonl', cache.tokenizer_hash)}" in out
    assert "100%" in err  # the progress line (a log prints quarters)

    code, out, err = run(capsys, "data", "lengths", "stats", workspace / "lengths.jsonl", "--buckets", "3")
    assert code == 0, err
    for choice in optimal_bucket_choices(cache.lengths, 3):
        assert f"edges {','.join(map(str, choice.edges))} " in out and f"padding {choice.padding_tokens} tokens" in out
    assert f"p99 {percentiles(cache.lengths)[99.0]}" in out

    code, out, err = run(capsys, "data", "lengths", "stats", workspace / "lengths.jsonl", "--json")
    summary = json.loads(out)
    assert code == 0 and summary["samples"] == 500 and summary["tokens"] == int(cache.lengths.sum())
    assert summary["max"] == int(cache.lengths.max()) and len(summary["bucket_edges"]) == 4
    assert sum(row["count"] for row in summary["histogram"]) == 500
    assert summary["bucket_edges"][1] == optimal_bucket_choices(cache.lengths, 2)[1].to_dict()


def test_build_prompt_response_and_options(workspace, tokenizer, capsys):
    argv = ["data", "lengths", "build", "--dataset", workspace / "train.jsonl", "--tokenizer",
            workspace / "tokenizer.json", "--output", workspace / "sft.jsonl", "--prompt-field", "prompt",
            "--response-field", "response", "--eos-token", "</s>", "--chunk-size", "33", "--quiet"]
    # an --id-field the records lack is refused (it named the rows by number before, without a word)
    code, _, err = run(capsys, *argv, "--id-field", "none")
    assert code == 2 and "line 1 lacks the id field 'none'" in err and not (workspace / "sft.jsonl").exists()
    code, _, err = run(capsys, *argv)
    assert code == 0 and err == "", err
    cache = LengthCache.load(workspace / "sft.jsonl")
    assert not cache.ids_are_line_numbers and cache.sample_ids[:2] == ["train_00000", "train_00001"]
    texts = corpus(500, seed=11)
    expected = [len(tokenizer.encode(f"### Instruction:\n{t[:10]}\n\n### Response:\n{t[10:]}")) + 1 for t in texts]
    assert cache.lengths.tolist() == expected
    # --force replaces; without it the existing output stays
    code, _, err = run(capsys, "data", "lengths", "build", "--dataset", workspace / "train.jsonl", "--tokenizer",
                       workspace / "model", "--output", workspace / "sft.jsonl", "--quiet")
    assert code == 2 and err.startswith(f"error {errors.OUTPUT_EXISTS}:")
    code, _, _ = run(capsys, "data", "lengths", "build", "--dataset", workspace / "train.jsonl", "--tokenizer",
                     workspace / "model", "--output", workspace / "sft.jsonl", "--quiet", "--force",
                     "--text-field", "prompt")
    assert code == 0
    assert LengthCache.load(workspace / "sft.jsonl", sidecar="require").lengths.tolist() == \
        [len(tokenizer.encode(t[:10])) for t in texts]


@pytest.mark.parametrize("content,code", [
    (b'{"text": "a"}\n{"text": \n', errors.DATASET_RECORD_INVALID),
    (b'{"text": "a"}\n{"body": "b"}\n', errors.DATASET_RECORD_INVALID),
    (b'{"text": "\xff"}\n', errors.DATASET_RECORD_INVALID),
    (b"", errors.DATASET_EMPTY),
])
def test_build_failures(workspace, capsys, content, code):
    (workspace / "bad.jsonl").write_bytes(content)
    status, out, err = run(capsys, "data", "lengths", "build", "--dataset", workspace / "bad.jsonl",
                           "--tokenizer", workspace / "model", "--output", workspace / "l.jsonl", "--quiet")
    assert status == 2 and out == "" and err.startswith(f"error {code}:") and "Traceback" not in err
    assert not (workspace / "l.jsonl").exists() and not (workspace / "l.jsonl.u32").exists()
    assert not [name for name in os.listdir(workspace) if name.startswith(".tmp-")]


def test_other_failures(workspace, capsys):
    base = ["data", "lengths", "build", "--dataset", workspace / "train.jsonl", "--output", workspace / "l.jsonl",
            "--quiet"]
    status, _, err = run(capsys, *base, "--tokenizer", workspace / "missing")
    assert status == 2 and err.startswith(f"error {errors.TOKENIZER_INVALID}:")
    status, _, err = run(capsys, *base, "--tokenizer", workspace / "tokenizer.json", "--prompt-field", "prompt",
                         "--response-field", "response")
    assert status == 2 and err.startswith(f"error {errors.TOKENIZER_INVALID}:") and "--eos '</s>'" in err
    status, _, err = run(capsys, "data", "lengths", "stats", workspace / "none.jsonl")
    assert status == 2 and err.startswith(f"error {errors.LENGTHS_INVALID}:")
    (workspace / "rows.jsonl").write_text('{"sample_id": "a", "tokenizer_hash": "h", "length": -4}\n')
    status, _, err = run(capsys, "data", "lengths", "stats", workspace / "rows.jsonl")
    assert status == 2 and err.startswith(f"error {errors.LENGTHS_INVALID}:") and "line 1" in err


@pytest.mark.parametrize("argv,message", [
    (["--prompt-field", "prompt"], "--prompt-field and --response-field go together"),
    (["--response-field", "response"], "--prompt-field and --response-field go together"),
    (["--text-field", "text", "--prompt-field", "prompt", "--response-field", "r"], "not allowed with"),
    (["--chunk-size", "0"], "chunk size must be a positive integer"),
])
def test_usage_errors(workspace, capsys, argv, message):
    with pytest.raises(SystemExit) as info:
        main(["data", "lengths", "build", "--dataset", str(workspace / "train.jsonl"), "--tokenizer",
              str(workspace / "model"), "--output", str(workspace / "l.jsonl"), *argv])
    assert info.value.code == 2 and message in capsys.readouterr().err
    assert not (workspace / "l.jsonl").exists()


def test_help_and_missing_action(capsys):
    assert main(["data"]) == 1 and "lengths" in capsys.readouterr().out
    assert main(["data", "lengths"]) == 1 and "stats" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "data" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["--help"], ["data", "--help"], ["data", "tokenize", "--help"],
                                  ["data", "lengths", "build", "--help"]])
def test_help_says_which_formats_are_read(capsys, argv):
    """Each help that offers to read a dataset names its formats, in the one phrase the commands share."""
    from umlos_cuda.commands._dataset_args import DATASET_FORMATS

    with pytest.raises(SystemExit):
        main(argv)
    printed = " ".join(capsys.readouterr().out.split())
    assert "Parquet" in DATASET_FORMATS and DATASET_FORMATS in printed


def test_installed_command(workspace):
    """The console script, as a user runs it (a new process, progress in a log)."""
    result = subprocess.run([os.path.join(os.path.dirname(sys.executable), "umlos-cuda"), "data", "lengths",
                             "build", "--dataset", "train.jsonl", "--tokenizer", "model", "--output", "l.jsonl"],
                            cwd=workspace, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert re.fullmatch(r"lengths l\.jsonl: 100% \([\d.]+ MB/[\d.]+ MB\) in [\d.]+ s, [\d.]+ MB/s",
                        result.stderr.strip().splitlines()[-1]), result.stderr
    assert np.array_equal(LengthCache.load(workspace / "l.jsonl").lengths,
                          LengthCache.load(workspace / "l.jsonl", sidecar="ignore").lengths)
