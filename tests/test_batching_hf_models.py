"""Collated batches as a ``transformers`` causal LM takes them (docs/batching.md, "Collation presets").

A small Llama (2 layers, hidden size 32, random weights from a config, no
download; float64, eval mode, so dropout is off and every comparison is of
one deterministic computation) is fed the presets of
umlos_cuda/batching/presets.py:

* a packed row (several sequences, padding, a second row of one sequence)
  under the ``hf`` preset's 4-D block-diagonal mask and restarting
  position ids gives, at every trained token, the loss each sequence gives
  run alone, with ``eager`` (additive float mask; to 1e-6, as its softmax
  is float32) and ``sdpa`` (boolean mask; to 1e-12), see :data:`TOLERANCE`;
  the same row under a plain causal mask differs by more than 1e-3 at every
  token after the row's first sequence (the leak);
* the ``padding_free`` preset (one row, ``position_ids``, ``cu_seq_lens``):
  the variable-length kernels that read ``cu_seq_lens_q/k`` are
  FlashAttention's, which has no CPU build, so on CPU the proof is through
  the path ``transformers`` takes for ``eager``/``sdpa``: it finds the
  sequences from the restarting ``position_ids``, which it does only when
  the forward has no cache (``use_cache=False``); with the config's default
  ``use_cache=True`` it attends across the row (asserted, as a warning to
  keep true); with FlashAttention installed and a GPU the varlen path is
  compared too;
* ``model(**hf)`` gives the loss computed by hand from unshifted logits and
  the ``shifted`` preset's targets, and ``cross_entropy`` takes both
  presets' int64 labels;
* ``padding_free`` equals ``DataCollatorWithFlattening(return_flash_attn_kwargs=True,
  return_position_ids=True)`` on the same sequences: keys, dtypes, values;
* ``PlanCollator(preset=...)`` in a DataLoader yields what ``apply_preset``
  makes of ``collate_microbatch``, and the model takes it as it is; for a
  packed plan it refuses a 2-D mask when built.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
F = torch.nn.functional

from batching_cases import expect  # noqa: E402
from token_cases import make_store  # noqa: E402
from umlos_cuda import errors  # noqa: E402
from umlos_cuda.batching import (BatchingConfig, BatchPlanBuilder, PackingConfig, collate_microbatch,  # noqa: E402
                                 default_collate)
from umlos_cuda.batching.presets import apply_preset  # noqa: E402

#: Per-token losses of a packed row and of its sequences alone agree to this. The model is float64, but
#: ``eager`` attention takes its softmax in float32 (modeling_llama.py), whose rounding differs with the row's
#: width (3e-9 seen); ``sdpa`` stays in float64 (0 seen).
TOLERANCE = {"eager": 1e-6, "sdpa": 1e-12}
#: What a leak changes at least (a token that sees another sequence; 0.03 and more seen).
LEAK = 1e-3
VOCAB = 96

#: Three sequences and their loss masks (a prompt of 0s in the first), packed into row 0; row 1 holds one.
SEQUENCES = [([5, 6, 7, 8, 9, 10], [0, 0, 1, 1, 1, 1]), ([11, 12, 13], [1, 1, 1]), ([14, 15, 16, 17], [1, 1, 0, 1])]
SINGLE = ([20, 21, 22, 23, 24], [1, 1, 1, 1, 1])


def tiny_llama(attn: str, vocab: int = VOCAB):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=vocab,
                                      max_position_embeddings=64, attn_implementation=attn)
    return transformers.LlamaForCausalLM(config).double().eval()


def packed_batch():
    """Row 0: the three sequences packed; row 1: one sequence; both padded to 20."""
    ids = [t for s, _ in SEQUENCES for t in s]
    mask = [m for _, s in SEQUENCES for m in s]
    segments = [k for k, (s, _) in enumerate(SEQUENCES) for _ in s]
    return default_collate([(ids, mask, segments), SINGLE], 20, "pad_to_bucket")


def tensors(arrays: dict) -> dict:
    return {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in arrays.items()}


def token_losses(logits, labels):
    """Loss of every position that a model shifting by itself trains on: ``{(row, t): loss}``, ``labels``
    unshifted."""
    losses = F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), reduction="none")
    losses = losses.view(labels.shape[0], -1)
    return {(b, t + 1): float(losses[b, t]) for b, t in zip(*np.nonzero(labels[:, 1:].numpy() != -100))}


def alone_losses(model):
    """Per-token losses of each sequence run by itself, keyed by its place in :func:`packed_batch`."""
    out, start = {}, 0
    for row, placed in ((0, SEQUENCES), (1, [SINGLE])):
        start = 0
        for ids, mask in placed:
            hf = tensors(apply_preset(default_collate([(ids, mask)], None), "hf"))
            with torch.no_grad():
                logits = model(input_ids=hf["input_ids"]).logits
            out.update({(row, start + t): loss for (_, t), loss in token_losses(logits, hf["labels"]).items()})
            start += len(ids)
    return out


def assert_close(got: dict, want: dict, tolerance: float) -> float:
    trained = sum(sum(mask[1:]) for _, mask in SEQUENCES + [SINGLE])  # a sequence's first token is never predicted
    assert got.keys() == want.keys() and len(want) == trained
    worst = max(abs(got[k] - want[k]) for k in want)
    assert worst <= tolerance, worst
    return worst


@pytest.mark.parametrize("attn, mask_dtype", [("eager", "float64"), ("sdpa", "bool")])
def test_a_packed_row_under_the_4d_mask_gives_each_sequences_losses(attn, mask_dtype):
    model = tiny_llama(attn)
    hf = tensors(apply_preset(packed_batch(), "hf", mask_dtype=mask_dtype))
    assert hf["attention_mask"].shape == (2, 1, 20, 20) and hf["input_ids"].dtype == torch.int64
    with torch.no_grad():
        logits = model(**hf).logits
    want = alone_losses(model)
    assert_close(token_losses(logits, hf["labels"]), want, TOLERANCE[attn])

    # the leak: the same row under a plain causal mask (padding masked, positions restarting)
    plain = tensors(apply_preset(packed_batch(), "hf"))
    plain["attention_mask"] = torch.from_numpy(packed_batch().attention_mask.astype(np.int64))
    with torch.no_grad():
        leaked = token_losses(model(**plain).logits, plain["labels"])
    first = {k for k in want if k[0] == 0 and k[1] < len(SEQUENCES[0][0])} | {k for k in want if k[0] == 1}
    assert max(abs(leaked[k] - want[k]) for k in first) <= TOLERANCE[attn]  # nothing before them to leak from
    assert min(abs(leaked[k] - want[k]) for k in want.keys() - first) > LEAK  # every later token sees the first


def finds_packed_sequences() -> bool:
    """Whether this transformers builds masks from restarting position_ids (masking_utils, 5.x)."""
    import importlib

    try:
        return hasattr(importlib.import_module("transformers.masking_utils"), "find_packed_sequence_indices")
    except ImportError:
        return False


@pytest.mark.skipif(not finds_packed_sequences(), reason="this transformers does not find packed sequences "
                                                          "from position_ids (masking_utils, transformers 5)")
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_the_padding_free_preset_through_position_ids(attn):
    model = tiny_llama(attn)
    flat = tensors(apply_preset(packed_batch(), "padding_free"))
    with torch.no_grad():
        logits = model(**flat, use_cache=False).logits
        cached = model(**flat).logits  # the config's use_cache=True: a cache, and no packing detected
    want = alone_losses(model)
    # one row: map its positions back to (row, t) of the padded batch
    places = [(0, t) for t in range(13)] + [(1, t) for t in range(5)]
    got = {places[t]: loss for (_, t), loss in token_losses(logits, flat["labels"]).items()}
    assert_close(got, want, TOLERANCE[attn])
    leaked = {places[t]: loss for (_, t), loss in token_losses(cached, flat["labels"]).items()}
    assert max(abs(leaked[k] - want[k]) for k in want) > LEAK  # transformers' trap: see docs/batching.md


@pytest.mark.skipif(not (torch.cuda.is_available() and transformers.utils.is_flash_attn_2_available()),
                    reason="the varlen path (cu_seq_lens_q/k) is FlashAttention's: it needs a GPU and flash-attn")
def test_the_padding_free_preset_through_flash_attention_varlen():  # pragma: no cover - GPU only
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB,
                                      attn_implementation="flash_attention_2")
    model = transformers.LlamaForCausalLM(config).to("cuda", torch.bfloat16).eval()
    flat = {k: v.cuda() if isinstance(v, torch.Tensor) else v
            for k, v in tensors(apply_preset(packed_batch(), "padding_free")).items()}
    with torch.no_grad():
        logits = model(**flat).logits.float()
        start = 0
        for ids, _ in SEQUENCES + [SINGLE]:
            alone = model(input_ids=torch.tensor([ids], device="cuda")).logits.float()
            assert (logits[0, start:start + len(ids)] - alone[0]).abs().max() < 2e-2  # bfloat16
            start += len(ids)


def test_model_loss_equals_cross_entropy_on_the_shifted_targets():
    model = tiny_llama("sdpa")
    batch = packed_batch()
    hf = tensors(apply_preset(batch, "hf"))
    shifted = tensors(apply_preset(batch, "shifted", dtype="int64"))
    assert hf["labels"].dtype == shifted["labels"].dtype == torch.int64
    with torch.no_grad():
        out = model(**hf)
    # a plain loop: logits at t against the target already at t (shifted), no shift of its own; transformers
    # takes its loss on float32 logits (loss_utils.ForCausalLMLoss), so this does too (1e-7 apart otherwise)
    by_hand = F.cross_entropy(out.logits.float().flatten(0, 1), shifted["labels"].flatten())
    assert abs(float(out.loss) - float(by_hand)) <= 1e-6
    unshifted = F.cross_entropy(out.logits[:, :-1].flatten(0, 1), hf["labels"][:, 1:].flatten())
    shifted64 = F.cross_entropy(out.logits.flatten(0, 1), shifted["labels"].flatten())
    assert abs(float(unshifted) - float(shifted64)) <= TOLERANCE["sdpa"]  # the same terms, in float64
    with pytest.raises(RuntimeError):  # what the issue began with: int32 targets
        F.cross_entropy(out.logits.flatten(0, 1), torch.from_numpy(batch.labels).flatten())


@pytest.mark.parametrize("return_tensors", ["np", "pt"])
def test_padding_free_equals_data_collator_with_flattening(return_tensors):
    collator = transformers.DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_position_ids=True,
                                                       return_tensors=return_tensors)
    sequences = SEQUENCES + [SINGLE]
    features = [{"input_ids": ids, "labels": [t if m else -100 for t, m in zip(ids, mask)]} for ids, mask in sequences]
    theirs = collator(features)
    for batch in (packed_batch(), default_collate(sequences, 8, "pad_to_bucket")):  # packed, and one per row
        ours = apply_preset(batch, "padding_free")
        if return_tensors == "pt":
            ours = tensors(ours)
        assert list(ours) == list(theirs)
        for key, value in theirs.items():
            if isinstance(value, int):
                assert type(ours[key]) is int and ours[key] == value, key
            else:
                assert ours[key].dtype == value.dtype and ours[key].shape == value.shape, key
                assert ours[key].tolist() == value.tolist(), key


# ====================================================================== PlanCollator presets
@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    return root, make_store(root, 60, seed=3)


@pytest.mark.parametrize("packed, preset", [(False, "hf"), (True, "hf"), (True, "padding_free"), (False, "shifted")])
def test_plan_collator_presets_feed_the_model(store, packed, preset):
    from torch.utils.data import DataLoader

    from umlos_cuda.torch import PackedBatchSampler, PlanBatchSampler, PlanCollator, TokenDataset

    root, source = store
    if packed:
        config = BatchingConfig(1024, (), 256, "pad_to_bucket", 7, pack=PackingConfig(256, "first_fit"))
    else:
        config = BatchingConfig.predictable(token_budget=1024, bucket_edges=(32, 64, 128), overflow_max=256, seed=7)
    plan = BatchPlanBuilder(source.length_cache(), config).build(1)
    sampler = PlanBatchSampler(plan, 0, 1)
    loader = DataLoader(TokenDataset(root / "store"), batch_sampler=PackedBatchSampler(sampler) if packed else sampler,
                        collate_fn=PlanCollator(plan, preset=preset, mask_dtype="float64"), num_workers=1)
    model = tiny_llama("eager", vocab=max(int(source.arrays(r)[0].max()) for r in range(len(source))) + 1)
    for step, (batch, mb) in enumerate(zip(loader, plan.iter_epoch(0))):
        want = collate_microbatch(source, mb, preset=preset, mask_dtype="float64",
                                  attention="4d" if packed and preset == "hf" else "auto")
        assert list(batch) == list(want) + (["rows"] if preset == "shifted" else [])
        for key, value in want.items():
            got = batch[key]
            assert (got == value) if isinstance(value, int) else np.array_equal(got.numpy(), value), key
        if preset == "shifted":
            assert batch["labels"].dtype == torch.int32
            break
        assert batch["labels"].dtype == batch["input_ids"].dtype == torch.int64
        if preset == "hf":
            assert batch["attention_mask"].dim() == (4 if packed else 2)
        with torch.no_grad():
            assert torch.isfinite(model(**batch, use_cache=False).loss)
        if step == 2:
            break


def test_plan_collator_refuses_a_2d_mask_for_a_packed_plan():
    from umlos_cuda.torch import PlanCollator

    packed = BatchingConfig(1024, (), 256, "pad_to_bucket", 7, pack=PackingConfig(256, "first_fit"))
    expect(errors.COLLATE_INPUT_INVALID, PlanCollator, packed, preset="hf", attention="2d", mention="4-D")
    expect(errors.COLLATE_INPUT_INVALID, PlanCollator, packed, preset="gpt", mention="shifted, hf, padding_free")
    assert PlanCollator(packed, preset="hf").options["attention"] == "4d"
