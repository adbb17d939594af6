"""The worked examples of docs/spec/feistel.md, and an independent Feistel.

:func:`spec_feistel` is the bijection written from the document alone, round
by round with the swap of the textbook Feistel network and Python's exact
integers; the examples check the package against it (and it against the
package) on every value they print. tests/test_spec_examples.py merges
:data:`FEISTEL_EXAMPLES` into its registry; ``python
tests/test_spec_examples.py NAME`` prints a block.
"""

from __future__ import annotations

import json

import numpy as np

import oracle
import umlos_cuda as uc
from umlos_cuda.epoch import epoch_seed, philox_key_words
from umlos_cuda.feistel import FEISTEL_M, FEISTEL_ROUNDS, feistel_halves, feistel_invert, feistel_permute, feistel_width
from umlos_cuda.modes import block_feistel, feistel
from umlos_cuda.philox import philox4x32_10
from umlos_cuda.reference import DOMAIN_BLOCK_FEISTEL, DOMAIN_FEISTEL
from umlos_cuda.sampler import sampler_config_hash

FEISTEL_EXAMPLES = {}


def example(name):
    def register(function):
        FEISTEL_EXAMPLES[name] = function
        return function

    return register


# ------------------------------------------------------------------ the bijection, from the document alone
def spec_width(n: int) -> int:
    return max(2, (n - 1).bit_length())


def spec_round_keys(words4) -> list[int]:
    """k_{2j} = lo32(word j), k_{2j+1} = hi32(word j)."""
    return [(w >> s) & 0xFFFFFFFF for w in words4 for s in (0, 32)]


def spec_encrypt(x: int, n: int, words4, trace=None) -> int:
    w = spec_width(n)
    high, low = w // 2, w - w // 2
    a, b, wa, wb = x >> low, x & ((1 << low) - 1), high, low
    for i, k in enumerate(spec_round_keys(words4)):
        p = (b ^ k) * FEISTEL_M
        t = ((p & 0xFFFFFFFF) ^ (p >> 32)) >> (32 - wa)
        if trace is not None:
            trace.append((i, a, b, p, t))
        a, b, wa, wb = b, a ^ t, wb, wa
    assert (wa, wb) == (high, low)
    return (a << low) | b


def spec_decrypt(y: int, n: int, words4) -> int:
    w = spec_width(n)
    high, low = w // 2, w - w // 2
    a, b = y >> low, y & ((1 << low) - 1)
    keys = spec_round_keys(words4)
    for i in range(FEISTEL_ROUNDS - 1, -1, -1):
        wa = high if i % 2 == 0 else low  # the width of the half round i wrote
        p = (a ^ keys[i]) * FEISTEL_M
        t = ((p & 0xFFFFFFFF) ^ (p >> 32)) >> (32 - wa)
        a, b = b ^ t, a
    return (a << low) | b


def spec_feistel(x: int, n: int, words4) -> int:
    """The bijection of [0, n): encrypt, then again while the value is >= n."""
    y = spec_encrypt(x, n, words4)
    while y >= n:
        y = spec_encrypt(y, n, words4)
    return y


def spec_feistel_inverse(y: int, n: int, words4) -> int:
    x = spec_decrypt(y, n, words4)
    while x >= n:
        x = spec_decrypt(x, n, words4)
    return x


def spec_key_words(seed16: bytes, domain: int, first_draw: int) -> tuple[int, int, int, int]:
    return (*oracle.draw(seed16, first_draw, domain), *oracle.draw(seed16, first_draw + 1, domain))


def check(x: int, n: int, words4) -> int:
    """The document's value, asserted equal to the package's, forwards and backwards."""
    y = spec_feistel(x, n, words4)
    assert int(feistel_permute(np.array([x], dtype=np.uint64), n, words4)[0]) == y
    assert int(feistel_invert(np.array([y], dtype=np.uint64), n, words4)[0]) == x == spec_feistel_inverse(y, n, words4)
    return y


# ------------------------------------------------------------------ helpers shared with test_spec_examples
def spec():
    import test_spec_examples

    return test_spec_examples


def toy_with(mode: str) -> dict:
    raw = json.loads(json.dumps(spec().TOY_RAW))
    raw["data"]["sampling_mode"] = mode
    return raw


def toy_seed_of(raw: dict, epoch: int = 0) -> bytes:
    m = uc.Manifest.from_dict(raw)
    return epoch_seed(m.replay_token, m.hash, spec().TOY_KEY, epoch)


def hex64(value: int) -> str:
    return f"0x{value:016x}"


# ------------------------------------------------------------------ the examples
@example("feistel-constants")
def feistel_constants():
    return [
        ("rounds", str(FEISTEL_ROUNDS)),
        ("M", f"0x{FEISTEL_M:08X}"),
        ("domain of mode feistel", str(DOMAIN_FEISTEL)),
        ("domain of mode block_feistel", str(DOMAIN_BLOCK_FEISTEL)),
    ]


@example("feistel-widths")
def feistel_widths():
    rows = []
    for n in (1, 2, 3, 4, 5, 30, 1 << 20, (1 << 20) + 1, 10**11, (1 << 64) - 1):
        w = spec_width(n)
        assert w == feistel_width(n) and feistel_halves(n) == (w // 2, w - w // 2)
        rows.append((f"N = {n}: w, high, low", f"{w}, {w // 2}, {w - w // 2}"))
    return rows


@example("feistel-toy-keys")
def feistel_toy_keys():
    t = spec()
    raw = toy_with("feistel")
    m = uc.Manifest.from_dict(raw)
    seed16 = toy_seed_of(raw)
    (k0, k1), w2, w3 = philox_key_words(seed16)
    rows = [
        ("canonical manifest", json.dumps(m.canonical, sort_keys=True)),
        ("manifest_hash", m.hash.hex()),
        ("epoch_seed", seed16.hex()),
        ("w0 w1 w2 w3", t.words(k0, k1, w2, w3)),
    ]
    words4 = []
    for n in (0, 1):
        counter = (n, 0, w2, w3 ^ DOMAIN_FEISTEL)
        x = tuple(int(v) for v in philox4x32_10(*counter, k0, k1))
        rows += [(f"draw {n}, domain 3, counter", t.words(*counter)), (f"draw {n}, domain 3, output", t.words(*x))]
        words4 += [x[0] | x[1] << 32, x[2] | x[3] << 32]
    assert tuple(words4) == spec_key_words(seed16, DOMAIN_FEISTEL, 0) == feistel.build_plan(seed16, 30, 8).keys
    rows.append(("key words (r0, r1 of draw 0, r0, r1 of draw 1)", " ".join(hex64(w) for w in words4)))
    rows.append(("round keys k0 .. k7", t.words(*spec_round_keys(words4))))
    return rows


@example("feistel-toy-trace")
def feistel_toy_trace():
    raw = toy_with("feistel")
    words4 = feistel.build_plan(toy_seed_of(raw), 30, 8).keys
    n = 30
    rows = [("N, w, high, low", f"{n}, {spec_width(n)}, {spec_width(n) // 2}, {spec_width(n) - spec_width(n) // 2}")]
    x, step = 5, 0
    while True:
        step += 1
        trace = []
        y = spec_encrypt(x, n, words4, trace)
        rows.append((f"pass {step}: input x", str(x)))
        for i, a, b, p, t in trace:
            rows.append((f"pass {step}: round {i}: a, b, p = (b XOR k{i}) * M, t", f"{a}, {b}, {hex64(p)}, {t}"))
        rows.append((f"pass {step}: output", f"{y}" + (" (>= N: walk on)" if y >= n else " (< N: done)")))
        if y < n:
            break
        x = y
    rows.append(("index of position 5", str(check(5, n, words4))))
    return rows


@example("feistel-toy-epoch")
def feistel_toy_epoch():
    t = spec()
    raw = toy_with("feistel")
    rows = []
    for epoch in (0, 1):
        words4 = feistel.build_plan(toy_seed_of(raw, epoch), 30, 8).keys
        expected = [check(p, 30, words4) for p in range(30)]
        got = uc.epoch_indices(raw, t.TOY_KEY, epoch=epoch, backend="numpy")
        assert [int(v) for v in got] == expected and sorted(expected) == list(range(30))
        assert uc.position_of(raw, t.TOY_KEY, epoch, expected[7]) == 7
        rows.append((f"epoch {epoch}, positions 0..29", t.ints(expected)))
    rows.append(("position_of(index of position 7, epoch 1)", "7"))
    return rows


@example("block-feistel-toy")
def block_feistel_toy():
    t = spec()
    raw = toy_with("block_feistel")
    seed16 = toy_seed_of(raw)
    n, block_size = 30, 8
    plan = block_feistel.build_plan(seed16, n, block_size)
    assert [int(v) for v in plan.block_order] == oracle.seeded_block_permute(seed16, n // block_size)
    rows = [("epoch_seed", seed16.hex()), ("block_order", t.ints(plan.block_order))]
    for pb in range(4):
        words4 = spec_key_words(seed16, DOMAIN_BLOCK_FEISTEL, 2 * pb)
        base, m = pb * block_size, min(block_size, n - pb * block_size)
        b = [int(v) for v in plan.base].index(base)
        assert words4 == tuple(int(k) for k in plan.keys_of(b))
        rows += [
            (f"pb = {pb}: key words (draws {2 * pb}, {2 * pb + 1}, domain 4)", " ".join(hex64(w) for w in words4)),
            (f"pb = {pb}: block_start, m, w", f"{base}, {m}, {spec_width(m)}"),
            (f"pb = {pb}: indices of local positions 0..{m - 1}",
             t.ints(base + check(local, m, words4) for local in range(m))),
        ]
    got = uc.epoch_indices(raw, t.TOY_KEY, backend="numpy")
    rows.append(("epoch 0, positions 0..29", t.ints(got)))
    return rows


@example("feistel-large")
def feistel_large():
    rows = []
    for n, positions in ((10**11, (0, 1, 2, 50_000_000_000, 99_999_999_999)),
                         ((1 << 64) - 1, (0, 1, (1 << 63) + 12345, (1 << 64) - 2))):  # fmt: skip
        raw = {"seed": 7, "global_batch_size": 4096, "data": {"sampling_mode": "feistel"},
               "datasets": {"big": {"id": "big", "version": "1", "hash": "none", "cardinality": n}}}  # fmt: skip
        m = uc.Manifest.from_dict(raw)
        words4 = feistel.build_plan(epoch_seed(m.replay_token, m.hash, "big", 0), n, 1 << 20).keys
        rows.append((f"N = {n}: w, key words", f"{spec_width(n)}, " + " ".join(hex64(w) for w in words4)))
        for p in positions:
            index = check(p, n, words4)
            assert int(uc.epoch_indices(m, "big", start=p, count=1, backend="numpy")[0]) == index
            rows.append((f"N = {n}: position {p}", str(index)))
    return rows


@example("feistel-hashes")
def feistel_hashes():
    rows = []
    for mode in (feistel.MODE, block_feistel.MODE):
        for text in mode.sampling_modes:
            digest = sampler_config_hash(text, 1 << 20, False, mode=mode.name)
            assert digest == oracle.hash_canonical([text, 1 << 20, False, *mode.config_tokens])
            rows.append((f"sampler_config_hash({text}, 1048576, false)", digest.hex()))
    return rows
