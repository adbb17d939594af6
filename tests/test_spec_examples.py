"""Every worked example in docs/spec/ is recomputed here, so the specification
cannot drift from the code.

A worked example in a spec document is a fenced ``text`` block preceded by
``<!-- example: NAME -->``; each line is ``label = value`` (a line that starts
with whitespace continues the previous value). For each NAME this file has a
function that computes the same labels from umlos_cuda; the test requires the
same labels, in the same order, with the same values (whitespace inside a value
is layout only and ignored). Examples are cross-checked against the independent
oracle (``tests/oracle.py``) where it computes the same thing.

``python tests/test_spec_examples.py [NAME ...]`` prints the blocks in the
documents' format, for writing or deliberately changing an example.
"""

from __future__ import annotations

import json
import os
import re
import struct
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import oracle
import umlos_cuda as uc
from umlos_cuda import errors
from umlos_cuda.epoch import build_plan_reference, epoch_seed, philox_key_words
from umlos_cuda.hashing import cbor_canonical, sha256
from umlos_cuda.nextbatch import data_replay_t, sampler_config_hash
from umlos_cuda.philox import PHILOX_KATS, philox4x32_10
from umlos_cuda.presets import MODE_STREAMING
from umlos_cuda.reference import DOMAIN_BLOCK_PERMUTE, DOMAIN_INTRA_BLOCK

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPEC_DIR = os.path.join(ROOT, "docs", "spec")

#: The toy manifest of the specification's worked examples (docs/spec/philox-and-hashing.md, §6).
TOY_KEY = "toy"
TOY_RAW = {
    "seed": 14,
    "global_batch_size": 12,
    "data": {"sampler_block_size": 8},
    "datasets": {
        TOY_KEY: {
            "id": "toy-corpus",
            "version": "1",
            "hash": "sha256:43fad7b30c9b261852fa389f76f18575dee5d816ac770dbbea3c39ec5f4efd69",
            "cardinality": 30,
        }
    },
}
TOY_WORLD_SIZE = 3

EXAMPLES = {}


def example(name):
    def register(function):
        EXAMPLES[name] = function
        return function

    return register


def words(*values: int) -> str:
    return " ".join(f"{v:08x}" for v in values)


def spaced_hex(data: bytes, group: int = 4) -> str:
    text = data.hex()
    return " ".join(text[i : i + 2 * group] for i in range(0, len(text), 2 * group))


def toy() -> uc.Manifest:
    return uc.Manifest.from_dict(TOY_RAW)


def toy_seed(epoch: int = 0) -> bytes:
    m = toy()
    return epoch_seed(m.replay_token, m.hash, TOY_KEY, epoch)


def ints(values) -> str:
    return "[" + ", ".join(str(int(v)) for v in values) + "]"


# ------------------------------------------------------------------ Philox and hashing
@example("philox-constants")
def philox_constants():
    from umlos_cuda import philox

    return [
        ("M0", f"0x{int(philox.PHILOX_M0):08X}"),
        ("M1", f"0x{int(philox.PHILOX_M1):08X}"),
        ("W0", f"0x{philox.PHILOX_W0:08X}"),
        ("W1", f"0x{philox.PHILOX_W1:08X}"),
        ("rounds", str(philox.PHILOX_ROUNDS)),
    ]


@example("philox-kat")
def philox_kat():
    rows = []
    for number, (counter, key, expected) in enumerate(PHILOX_KATS, 1):
        output = tuple(int(x) for x in philox4x32_10(*counter, *key))
        assert output == expected and oracle.philox4x32_10(counter, key) == expected
        rows += [
            (f"vector {number} counter", words(*counter)),
            (f"vector {number} key", words(*key)),
            (f"vector {number} output", words(*output)),
        ]
    return rows


CBOR_SAMPLES = [
    ("0", 0),
    ("23", 23),
    ("24", 24),
    ("1048576", 1048576),
    ("2^32", 1 << 32),
    ("2^64 - 1", (1 << 64) - 1),
    ("-1", -1),
    ('"train"', "train"),
    ("h'0102'", b"\x01\x02"),
    ("false", False),
    ("true", True),
    ("null", None),
    ("[1, [2, 3]]", [1, [2, 3]]),
    ('{"b": 1, "aa": 2, "a": 3}', {"b": 1, "aa": 2, "a": 3}),
    ("1.5", 1.5),
    ("100000.0", 100000.0),
    ("0.1", 0.1),
]


@example("cbor")
def cbor_examples():
    rows = []
    for label, value in CBOR_SAMPLES:
        encoded = cbor_canonical(value)
        assert encoded == oracle.cbor_canonical(value)
        rows.append((label, spaced_hex(encoded, 1)))
    return rows


@example("cursor-cbor")
def cursor_cbor():
    cursor = uc.Cursor(epoch=3, global_index=24)
    return [("Cursor(epoch=3, global_index=24)", spaced_hex(cursor.to_cbor(), 1))]


@example("toy-raw")
def toy_raw():
    return [("toy manifest", json.dumps(TOY_RAW))]


@example("toy-manifest")
def toy_manifest():
    m = toy()
    stated = json.loads(json.dumps(TOY_RAW))
    stated["spec_version"] = "UML_OS-v3.8-OS"
    stated["data"]["drop_last"] = False
    stated_hash = uc.Manifest.from_dict(stated).hash
    assert m.hash == oracle.manifest_hash(TOY_RAW) == stated_hash
    assert m.replay_token == oracle.replay_token(TOY_RAW)
    preimage = m.spec_version.encode("utf-8") + m.policy_hash + m.env_manifest_hash + struct.pack(">Q", m.seed)
    return [
        ("canonical manifest", json.dumps(m.canonical, sort_keys=True)),
        ("CBOR_CANONICAL(canonical manifest)", spaced_hex(cbor_canonical(dict(m.canonical)))),
        ("manifest_hash", m.hash.hex()),
        ("manifest_hash, defaults stated", stated_hash.hex()),
        ("policy_hash = SHA-256(CBOR_CANONICAL({}))", m.policy_hash.hex()),
        ("env_manifest_hash = SHA-256(CBOR_CANONICAL({}))", m.env_manifest_hash.hex()),
        ("token preimage", spaced_hex(preimage)),
        ("kernel_replay_token", m.replay_token.hex()),
    ]


@example("toy-epoch-seed")
def toy_epoch_seed():
    m = toy()
    preimage = cbor_canonical(["nextbatch_epoch_seed_v2", m.replay_token, m.hash, TOY_KEY, 0])
    seed16 = toy_seed(0)
    assert seed16 == oracle.epoch_seed(m.replay_token, m.hash, TOY_KEY, 0)
    (w0, w1), w2, w3 = philox_key_words(seed16)
    return [
        ("preimage", spaced_hex(preimage)),
        ("SHA-256(preimage)", sha256(preimage).hex()),
        ("epoch_seed", seed16.hex()),
        ("w0 w1 w2 w3", words(w0, w1, w2, w3)),
        ("key (k0, k1)", words(w0, w1)),
        ("counter of draw n, domain d", f"(lo32(n), hi32(n), {w2:08x}, {w3:08x} XOR d)"),
        ("epoch_seed of epoch 1", toy_seed(1).hex()),
    ]


def draw_rows(seed16: bytes, n: int, domain: int, prefix: str):
    (k0, k1), w2, w3 = philox_key_words(seed16)
    counter = (n & 0xFFFFFFFF, n >> 32, w2, w3 ^ domain)
    x = tuple(int(v) for v in philox4x32_10(*counter, k0, k1))
    r0, r1 = x[0] | x[1] << 32, x[2] | x[3] << 32
    assert (r0, r1) == oracle.draw(seed16, n, domain)
    return [
        (f"{prefix} counter", words(*counter)),
        (f"{prefix} output", words(*x)),
        (f"{prefix} r0", f"0x{r0:016x}"),
        (f"{prefix} r1", f"0x{r1:016x}"),
    ], r0, r1


@example("toy-block-permute")
def toy_block_permute():
    seed16 = toy_seed(0)
    n, block_size = 30, 8
    num_full = n // block_size
    order = list(range(num_full))
    rows = [("B = floor(N / block_size)", str(num_full)), ("start", ints(order))]
    for i in range(num_full - 1, 0, -1):
        draw, r0, _ = draw_rows(seed16, i, DOMAIN_BLOCK_PERMUTE, f"i = {i}: draw {i}, domain 1,")
        j = (r0 * (i + 1)) >> 64
        order[i], order[j] = order[j], order[i]
        rows += draw + [(f"i = {i}: j = (r0 * {i + 1}) >> 64", str(j)), (f"i = {i}: order after the swap", ints(order))]
    plan = build_plan_reference(seed16, n, block_size)
    assert order == [int(v) for v in plan.block_order] == oracle.seeded_block_permute(seed16, num_full)
    rows.append(("block_order", ints(order)))
    return rows


@example("toy-intra-block")
def toy_intra_block():
    seed16 = toy_seed(0)
    n, block_size = 30, 8
    plan = build_plan_reference(seed16, n, block_size)
    by_pb = {int(b) // block_size: i for i, b in enumerate(plan.base)}
    rows = []
    for pb in range(4):
        draw, k0, k1 = draw_rows(seed16, pb, DOMAIN_INTRA_BLOCK, f"pb = {pb}: draw {pb}, domain 2,")
        base = pb * block_size
        m = min(block_size, n - base)
        start = 1 + k0 % (m - 1)
        b = by_pb[pb]
        a, c = int(plan.a[b]), int(plan.c[b])
        assert (base, m, a, c) == oracle.affine_parameters(seed16, pb, block_size, n)
        assert c == k1 % m and int(plan.m[b]) == m
        rows += draw[:1] + draw[2:] + [
            (f"pb = {pb}: block_start, m", f"{base}, {m}"),
            (f"pb = {pb}: first candidate 1 + (k0 mod {m - 1})", str(start)),
            (f"pb = {pb}: a (first candidate coprime with {m})", str(a)),
            (f"pb = {pb}: c = k1 mod {m}", str(c)),
            (f"pb = {pb}: indices of local positions 0..{m - 1}",
             ints(base + (a * local + c) % m for local in range(m))),
        ]
    return rows


@example("toy-epoch")
def toy_epoch():
    m = toy()
    rows = []
    for epoch in (0, 1):
        indices = uc.epoch_indices(m, TOY_KEY, epoch=epoch, backend="numpy")
        expected = oracle.Oracle(TOY_RAW).epoch(TOY_KEY, epoch).window(0, 30)
        assert [int(v) for v in indices] == expected
        rows.append((f"epoch {epoch}, positions 0..29", ints(indices)))
    return rows


def toy_run(raw, stage, preset=None, steps=None, cursor=uc.Cursor()):
    """Rows ``step s rank r`` and ``cursor after step s`` of a run from ``cursor``."""
    rows = []
    model = oracle.Oracle(raw)
    start_epoch = cursor.epoch
    step = 0
    while (steps is None and cursor.epoch == start_epoch) or (steps is not None and step < steps):
        step += 1
        after = None
        for rank in range(TOY_WORLD_SIZE):
            batch = uc.next_batch(raw, TOY_KEY, TOY_WORLD_SIZE, rank, stage, cursor, backend="numpy", preset=preset)
            expected = model.next_batch(TOY_KEY, TOY_WORLD_SIZE, rank, stage, cursor.epoch, cursor.global_index,
                                        streaming=preset == "streaming_infinite")
            got = [int(v) for v in batch.indices]
            assert got == expected.indices and (batch.cursor.epoch, batch.cursor.global_index) == expected.cursor
            rows.append((f"step {step} rank {rank}", ints(got)))
            after = batch.cursor
        rows.append((f"cursor after step {step}", f"({after.epoch}, {after.global_index})"))
        cursor = after
    return rows


@example("toy-train")
def toy_train():
    return toy_run(TOY_RAW, "train")


@example("toy-train-drop-last")
def toy_train_drop_last():
    raw = json.loads(json.dumps(TOY_RAW))
    raw["data"]["drop_last"] = True
    return toy_run(raw, "train")


@example("toy-eval")
def toy_eval():
    return toy_run(TOY_RAW, "eval")


@example("toy-streaming")
def toy_streaming():
    return toy_run(TOY_RAW, "train", preset="streaming_infinite", steps=2, cursor=uc.Cursor(0, 24))


@example("metadata-hashes")
def metadata_hashes():
    m = toy()
    default = 1 << 20
    train_default = sampler_config_hash("SHUFFLE_WITHOUT_REPLACEMENT_BLOCK_AFFINE_V1", default, False)
    oracle_default = oracle.sampler_config_hash("SHUFFLE_WITHOUT_REPLACEMENT_BLOCK_AFFINE_V1", default, False)
    assert train_default.hex() == oracle_default.hex()
    replay = data_replay_t(m.replay_token, TOY_KEY, 0, 12, TOY_WORLD_SIZE, 1)
    batch = uc.next_batch(m, TOY_KEY, TOY_WORLD_SIZE, 1, "train", uc.Cursor(0, 12), backend="numpy")
    assert batch.metadata["data_replay_t"] == replay.hex()
    preimage = cbor_canonical(["nextbatch_v2", m.replay_token, TOY_KEY, 0, 12, TOY_WORLD_SIZE, 1])
    return [
        ("sampler_config_hash, train, block 2^20, drop_last false", train_default.hex()),
        ("preimage of the line above", spaced_hex(cbor_canonical(
            ["SHUFFLE_WITHOUT_REPLACEMENT_BLOCK_AFFINE_V1", default, False, "epoch_seed_rule_v2",
             "intra_block_affine_coprime_v1", "rank_contiguous_shard_v1"]))),
        ("sampler_config_hash, eval or infer, block 2^20, drop_last false",
         sampler_config_hash("SEQUENTIAL_V1", default, False).hex()),
        ("sampler_config_hash, streaming_infinite, block 2^20",
         sampler_config_hash(MODE_STREAMING, default, False).hex()),
        ("sampler_config_hash, toy train (block 8, drop_last false)", batch.metadata["sampler_config_hash"]),
        ("data_replay_t preimage, toy, epoch 0, position 12, W = 3, rank 1", spaced_hex(preimage)),
        ("data_replay_t", replay.hex()),
        ("epoch_seed_hash, toy epoch 0", batch.metadata["epoch_seed_hash"]),
    ]


@example("toy-metadata")
def toy_metadata():
    m = toy()
    batch = uc.next_batch(m, TOY_KEY, TOY_WORLD_SIZE, 1, "train", uc.Cursor(0, 24), backend="numpy")
    skip = {"sampler_config_hash", "data_replay_t", "epoch_seed_hash", "manifest_hash", "backend",
            "cursor_before", "cursor_after"}
    return [(key, json.dumps(value)) for key, value in batch.metadata.items() if key not in skip]


FAILURES = [
    ('dataset_key "nope"', dict(dataset_key="nope"), errors.INVALID_DATASET_KEY),
    ('stage "test"', dict(stage="test"), errors.INVALID_STAGE_TYPE),
    ("world_size 5 (12 is not a multiple of 5)", dict(world_size=5, rank=0), errors.BATCH_SIZE_INCONSISTENT),
    ("world_size 3, rank 3", dict(rank=3), errors.INVALID_RANK),
    ("world_size 0", dict(world_size=0, rank=0), errors.INVALID_RANK),
    ("cursor (0, 30)", dict(cursor=uc.Cursor(0, 30)), errors.GLOBAL_POSITION_EXCEEDS_CARDINALITY),
    ("drop_last true, cursor (0, 24)", dict(cursor=uc.Cursor(0, 24), drop_last=True),
     errors.GLOBAL_POSITION_EXCEEDS_CARDINALITY),
    ("drop_last true, global_batch_size 36 > N", dict(drop_last=True, global_batch_size=36),
     errors.BATCH_SIZE_INCONSISTENT),
    ("global_batch_size 0", dict(global_batch_size=0), errors.BATCH_SIZE_INCONSISTENT),
    ("sampler_block_size 0", dict(sampler_block_size=0), errors.BATCH_SIZE_INCONSISTENT),
    ("cardinality 0", dict(cardinality=0), errors.CARDINALITY_MISMATCH),
    ("world_size -1", dict(world_size=-1), errors.INVALID_MANIFEST),
    ("replay_token of 31 bytes", dict(replay_token=bytes(31)), errors.INVALID_MANIFEST),
    ('dataset_key "nope" and stage "test"', dict(dataset_key="nope", stage="test"), errors.INVALID_DATASET_KEY),
    ("world_size 5 and cursor (0, 30)", dict(world_size=5, rank=0, cursor=uc.Cursor(0, 30)),
     errors.BATCH_SIZE_INCONSISTENT),
    ("rank 7 of 3 and cursor (0, 30)", dict(rank=7, cursor=uc.Cursor(0, 30)), errors.INVALID_RANK),
]


@example("toy-failures")
def toy_failures():
    rows = []
    for label, change, code in FAILURES:
        raw = json.loads(json.dumps(TOY_RAW))
        for field in ("drop_last", "sampler_block_size"):
            if field in change:
                raw["data"][field] = change[field]
        if "global_batch_size" in change:
            raw["global_batch_size"] = change["global_batch_size"]
        if "cardinality" in change:
            raw["datasets"][TOY_KEY]["cardinality"] = change["cardinality"]
        with pytest.raises(uc.UmlosError) as info:
            uc.next_batch(raw, change.get("dataset_key", TOY_KEY), change.get("world_size", TOY_WORLD_SIZE),
                          change.get("rank", 0), change.get("stage", "train"), change.get("cursor", uc.Cursor()),
                          change.get("replay_token"), backend="numpy")
        assert info.value.code == code, (label, info.value)
        rows.append((label, info.value.code))
    return rows


# ------------------------------------------------------------------ large values
def large_manifest(n: int, block_size: int) -> dict:
    return {"seed": 7, "global_batch_size": 4096, "data": {"sampler_block_size": block_size},
            "datasets": {"big": {"id": "big", "version": "1", "hash": "none", "cardinality": n}}}


@example("large-1e11")
def large_1e11():
    raw = large_manifest(10**11, 1 << 20)
    positions = [0, 1, 2, 1 << 20, 5 * 10**10, 10**11 - 1]
    model = oracle.Oracle(raw).epoch("big", 0)
    rows = [("blocks (full + tail)", f"{10**11 // (1 << 20)} + 1 (the tail block holds {10**11 % (1 << 20)})")]
    for p in positions:
        value = int(uc.epoch_indices(raw, "big", epoch=0, start=p, count=1, backend="numpy")[0])
        assert value == model.index(p)
        rows.append((f"position {p}", str(value)))
    return rows


@example("large-exact")
def large_exact():
    n, block_size = (1 << 64) - 1, (1 << 62) + 1
    raw = large_manifest(n, block_size)
    m_obj = uc.Manifest.from_dict(raw)
    seed16 = epoch_seed(m_obj.replay_token, m_obj.hash, "big", 0)
    plan = build_plan_reference(seed16, n, block_size)
    p = 3 * block_size - 2
    b, local = p // block_size, p % block_size
    base, m, a, c = (int(plan.base[b]), int(plan.m[b]), int(plan.a[b]), int(plan.c[b]))
    exact = base + (a * local + c) % m
    wrapped = base + (((a * local + c) & ((1 << 64) - 1)) % m)
    value = int(uc.epoch_indices(raw, "big", epoch=0, start=p, count=1, backend="numpy")[0])
    assert value == exact == oracle.Oracle(raw).epoch("big", 0).index(p) and wrapped != exact
    return [
        ("N", str(n)),
        ("sampler_block_size", str(block_size)),
        ("position p", str(p)),
        ("virtual block b, local l", f"{b}, {local}"),
        ("permuted block pb", str(int(plan.block_order[b]))),
        ("block_start, m", f"{base}, {m}"),
        ("a, c", f"{a}, {c}"),
        ("a * l + c (exact)", str(a * local + c)),
        ("bits of a * l + c", str((a * local + c).bit_length())),
        ("index (exact)", str(exact)),
        ("index if a * l + c wrapped at 2^64 (wrong)", str(wrapped)),
    ]


# ------------------------------------------------------------------ the RNG and NextBatch_v1 documents
from spec_examples_rng import RNG_EXAMPLES  # noqa: E402  (docs/spec/rng.md, docs/spec/nextbatch-v1.md)

assert not set(RNG_EXAMPLES) & set(EXAMPLES)
EXAMPLES.update(RNG_EXAMPLES)

# ------------------------------------------------------------------ the Feistel modes
from spec_examples_feistel import FEISTEL_EXAMPLES  # noqa: E402  (docs/spec/feistel.md)

assert not set(FEISTEL_EXAMPLES) & set(EXAMPLES)
EXAMPLES.update(FEISTEL_EXAMPLES)


# ------------------------------------------------------------------ the test
EXAMPLE_MARK = re.compile(r"<!--\s*example:\s*([\w-]+)\s*-->")


def parse_examples(text: str, where: str) -> dict[str, list[tuple[str, str]]]:
    """``{NAME: [(label, value), ...]}`` of every example block in ``text``."""
    found = {}
    lines = text.splitlines()
    for number, line in enumerate(lines):
        mark = EXAMPLE_MARK.fullmatch(line.strip())
        if not mark:
            continue
        name = mark.group(1)
        assert name not in found, f"{where}: example {name} appears twice"
        fence = number + 1
        while fence < len(lines) and not lines[fence].strip():
            fence += 1
        assert fence < len(lines) and lines[fence].strip() == "```text", \
            f"{where}:{number + 1}: {name} needs a ```text block"
        entries: list[list[str]] = []
        for body in lines[fence + 1 :]:
            if body.strip() == "```":
                break
            if body[:1].isspace() and entries:
                entries[-1][1] += body.strip()
                continue
            label, sep, value = body.rpartition(" = ")  # labels may contain " = ", values never do
            assert sep, f"{where}: example {name}: line {body!r} is not 'label = value'"
            entries.append([label.strip(), value.strip()])
        else:
            raise AssertionError(f"{where}: example {name} is not closed")
        found[name] = [(label, value) for label, value in entries]
    return found


def spec_examples() -> dict[str, tuple[str, list[tuple[str, str]]]]:
    out = {}
    for name in sorted(os.listdir(SPEC_DIR)):
        if name.endswith(".md"):
            path = os.path.join(SPEC_DIR, name)
            with open(path, encoding="utf-8") as handle:
                for example_name, entries in parse_examples(handle.read(), name).items():
                    assert example_name not in out, f"example {example_name} is in two documents"
                    out[example_name] = (name, entries)
    return out


def squash(value: str) -> str:
    return re.sub(r"\s+", "", value)


def test_every_example_in_the_spec_is_known_and_every_known_example_is_in_the_spec():
    assert set(spec_examples()) == set(EXAMPLES)


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_worked_example_matches_the_code(name):
    documents = spec_examples()
    assert name in documents, f"example {name} is not in docs/spec"
    where, documented = documents[name]
    computed = EXAMPLES[name]()
    assert [label for label, _ in documented] == [label for label, _ in computed], f"{where}: labels of {name}"
    for (label, doc_value), (_, value) in zip(documented, computed):
        assert squash(doc_value) == squash(value), f"{where}: {name}: {label}: documented {doc_value}, computed {value}"


def test_the_index_counts_the_golden_cases_right():
    from umlos_cuda.commands._golden_vectors import load_golden

    with open(os.path.join(SPEC_DIR, "README.md"), encoding="utf-8") as handle:
        cases, manifests = map(int, re.search(r"(\d+) cases over (\d+) manifests", handle.read()).groups())
    document = load_golden(os.path.join(ROOT, "golden", "nextbatch_v2.json"))
    assert (cases, manifests) == (len(document["cases"]), len(document["manifests"]))


def test_parser_rejects_a_malformed_block():
    with pytest.raises(AssertionError):
        parse_examples("<!-- example: x -->\n```text\nno separator here\n```\n", "t.md")
    with pytest.raises(AssertionError):
        parse_examples("<!-- example: x -->\n```text\na = 1\n", "t.md")
    assert parse_examples("<!-- example: x -->\n\n```text\na = 1 2\n  3\nb = c = d\n```\n", "t.md") == {
        "x": [("a", "1 23"), ("b = c", "d")]
    }


def wrap(value: str, width: int = 72) -> list[str]:
    """Split a long hex or list value into lines for the document (layout only)."""
    if len(value) <= width:
        return [value]
    separator = ", " if value.startswith("[") else " "
    lines, current = [], ""
    for part in value.split(separator):
        candidate = part if not current else current + separator + part
        if current and len(candidate) > width:
            lines.append(current + separator.rstrip())
            current = part
        else:
            current = candidate
    return lines + [current]


def format_block(name: str) -> str:
    rows = EXAMPLES[name]()
    assert not any(" = " in value for _, value in rows), f"{name}: a value may not contain ' = '"
    width = min(40, max(len(label) for label, _ in rows))
    body = []
    for label, value in rows:
        chunks = wrap(value)
        body.append(f"{label:<{width}} = {chunks[0]}")
        body += ["    " + chunk for chunk in chunks[1:]]
    return f"<!-- example: {name} -->\n```text\n" + "\n".join(body) + "\n```"


if __name__ == "__main__":
    for example_name in sys.argv[1:] or sorted(EXAMPLES):
        print(format_block(example_name) + "\n")
