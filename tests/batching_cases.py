"""Helpers of the batching tests: small tokenizers trained here, on fixed
text (no network), and the failure-code assertion.

``train_tokenizer`` trains a byte-level BPE with the ``tokenizers`` library;
the same arguments give the same tokenizer. ``write_model_dir`` lays one out
as a model directory (``tokenizer.json`` beside ``tokenizer_config.json``).
``expect`` calls a function and checks the ``UmlosError`` it must raise.
"""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from umlos_cuda import errors
from umlos_cuda.errors import UmlosError

WORDS = ("the quick brown fox jumps over a lazy dog while gravity explains why python is what it is "  # noqa: SIM905
         "héllo wörld naïve café").split()
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")


def corpus(lines: int = 400, seed: int = 0) -> list[str]:
    """Deterministic sentences of 1 to 40 words."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 40))) for _ in range(lines)]


def train_tokenizer(vocab_size: int = 300, normalizer: str = "nfkc"):
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.normalizer = {"nfkc": normalizers.NFKC(), "nfc": normalizers.NFC(),
                            "lowercase": normalizers.Lowercase()}[normalizer]
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(corpus(), trainer)
    return tokenizer


def write_model_dir(path, tokenizer, config: dict | None = None, chat_template_file: str | None = None):
    """A model directory: tokenizer.json, and tokenizer_config.json when ``config`` is given."""
    path.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(path / "tokenizer.json"))
    if config is not None:
        (path / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    if chat_template_file is not None:
        (path / "chat_template.jinja").write_text(chat_template_file, encoding="utf-8")
    return path


def tokenizer_json(tokenizer) -> dict:
    return json.loads(tokenizer.to_str())


def from_json(data: dict):
    from tokenizers import Tokenizer

    return Tokenizer.from_str(json.dumps(data))


def expect(code: str, function, *args, mention: str | None = None, **kwargs) -> UmlosError:
    """``function(*args, **kwargs)`` raises UmlosError ``code``, its message
    containing ``mention``; the batching codes name the batching operator
    (the shared OUTPUT_* codes come from the file writer)."""
    with pytest.raises(UmlosError) as info:
        function(*args, **kwargs)
    assert info.value.code == code, info.value
    if not code.startswith("OUTPUT_"):
        assert info.value.record["failure_operator"] == errors.BATCHING_OPERATOR
    if mention:
        assert mention in info.value.message, info.value.message
    return info.value


def small_plan(n: int, seed: int, packed: bool, ids):
    """A 2-epoch plan of ``n`` random lengths below 90, bucketed or packed (greedy, a separator of
    ``seed % 3``), with ``ids`` as its sample ids: what the plan-file writers are checked on."""
    from umlos_cuda.batching import BatchingConfig, BatchPlanBuilder
    from umlos_cuda.batching.packing.config import PackingConfig

    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 90, n)
    if packed:
        config = BatchingConfig(256, (), 64, seed=seed, pack=PackingConfig(64, "greedy", separator_len=seed % 3))
    else:
        config = BatchingConfig(256, (16, 32), 64, seed=seed)
    return BatchPlanBuilder(lengths, config, tokenizer_hash="t", sample_ids=ids).build(2)
