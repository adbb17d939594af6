"""The quickstart's inputs in examples/data/ are what examples/data/make_quickstart_data.py makes.

docs/quickstart.md reads them (tests/test_docs.py runs the page from the
repository's root and checks the validation loss it prints); this file runs
the script into a temporary folder and compares: the same files, the same
bytes under the pyarrow and tokenizers versions that wrote the bundled ones
(``generated-with.json``), and under any version the same rows and the same
tokenizer, as the installed libraries read them. Then what the page reads: the chat files render with the
bundled template, and the preference records (TRL's conversational form) tokenize to the rows TRL's
``DPOTrainer`` makes of them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "examples", "data")
SCRIPT = "make_quickstart_data.py"
#: What the bundled inputs may weigh in the repository, all together.
MAX_BUNDLED_BYTES = 1 << 20


def files_under(folder: str) -> dict[str, bytes]:
    """Every file below ``folder`` (relative path to bytes), the script and bytecode caches left out."""
    found = {}
    for parent, dirs, files in os.walk(folder):
        dirs[:] = [name for name in dirs if name != "__pycache__"]
        for name in files:
            path = os.path.join(parent, name)
            if os.path.relpath(path, folder) != SCRIPT:
                with open(path, "rb") as handle:
                    found[os.path.relpath(path, folder)] = handle.read()
    return found


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> dict[str, bytes]:
    """The files the script writes into an empty folder, with this checkout's package."""
    output = tmp_path_factory.mktemp("quickstart-data")
    result = subprocess.run([sys.executable, os.path.join(DATA, SCRIPT), "--output", str(output)],
                            env={**os.environ, "PYTHONPATH": ROOT}, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    return files_under(str(output))


def test_the_script_makes_every_bundled_file_and_no_other(made):
    bundled = files_under(DATA)
    assert sorted(made) == sorted(bundled)
    assert {"chat-train.parquet", "chat-validation.parquet", os.path.join("tokenizer", "tokenizer.json")} <= set(made)
    assert sum(map(len, bundled.values())) < MAX_BUNDLED_BYTES


def test_the_bundled_files_are_the_bytes_the_script_writes(made):
    import pyarrow
    import tokenizers

    recorded = json.loads(files_under(DATA)["generated-with.json"])
    installed = {"pyarrow": pyarrow.__version__, "tokenizers": tokenizers.__version__}
    if recorded != installed:  # a Parquet file names the pyarrow that wrote it; make test installs the pinned ones
        pytest.skip(f"the bundled files were written with {recorded}, this environment has {installed}")
    bundled = files_under(DATA)
    assert [name for name in sorted(made) if made[name] != bundled[name]] == []


def test_the_bundled_rows_and_tokenizer_are_what_the_script_makes(made, tmp_path):
    """Under any library versions: every Parquet file holds the same schema and rows, every other file but
    the tokenizer is the same bytes, and the tokenizer is the same model once the installed library reads it."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from tokenizers import Tokenizer

    bundled = files_under(DATA)
    for name in sorted(made):
        if name.endswith(".parquet"):
            want, got = (pq.read_table(pa.BufferReader(files[name])) for files in (bundled, made))
            assert got.schema == want.schema and got.equals(want), name
            assert want.num_rows >= 60, name
        elif name == os.path.join("tokenizer", "tokenizer.json"):
            want, got = (Tokenizer.from_str(files[name].decode()) for files in (bundled, made))
            assert got.to_str() == want.to_str()
            assert want.get_vocab_size() == 512 and want.token_to_id("<|im_end|>") == 2
        elif name != "generated-with.json":
            assert made[name] == bundled[name], name


def test_the_chat_data_render_with_the_bundled_template():
    """Every conversation of the bundled chat files has an assistant turn that the ChatML template's loss mask
    covers, end of turn included (what docs/quickstart.md trains on)."""
    import pyarrow.parquet as pq

    from umlos_cuda.batching import encode_chat

    tokenizer = os.path.join(DATA, "tokenizer")
    for name in ("chat-train.parquet", "chat-validation.parquet", "math-train.parquet"):
        rows = pq.read_table(os.path.join(DATA, name)).to_pylist()
        assert len({row["id"] for row in rows}) == len(rows), name
        for row in rows[:20]:
            sample = encode_chat(tokenizer, row["messages"])
            trained = [token for token, mask in zip(sample.input_ids, sample.assistant_mask.tolist()) if mask]
            assert trained.count(2) == sum(m["role"] == "assistant" for m in row["messages"]), row["id"]


def test_the_bundled_preferences_tokenize_to_trls_dpo_rows(tmp_path):
    """The preference records are TRL's conversational form, and section 3's ``data tokenize --conversational``
    makes of them, with the bundled ChatML tokenizer, the rows TRL's ``DPOTrainer`` makes: every record's chosen
    and rejected row, token for token and mask for mask, with a loss mask that trains on each answer."""
    import pyarrow.parquet as pq

    pytest.importorskip("trl")
    pytest.importorskip("datasets")
    transformers = pytest.importorskip("transformers")
    from preference_cases import equality, trl_rows

    from umlos_cuda.batching import TokenStore
    from umlos_cuda.cli import main

    records = pq.read_table(os.path.join(DATA, "preferences.parquet")).to_pylist()
    assert all([m["role"] for m in row["prompt"]] == ["user"] and [m["role"] for m in row["chosen"]] ==
               [m["role"] for m in row["rejected"]] == ["assistant"] for row in records)
    output = tmp_path / "preferences"
    assert main(["data", "tokenize", "--dataset", os.path.join(DATA, "preferences.parquet"), "--conversational",
                 "--prompt-field", "prompt", "--chosen-field", "chosen", "--rejected-field", "rejected",
                 "--tokenizer", os.path.join(DATA, "tokenizer"), "--output", str(output), "--quiet"]) == 0
    store = TokenStore.open(str(output))
    expected = trl_rows("pairs", records, transformers.AutoTokenizer.from_pretrained(os.path.join(DATA, "tokenizer")))
    assert equality(store, expected) == (2 * len(records), 2 * len(records))
    assert all(0 < mask.count(1) < len(mask) for _ids, mask in expected)
