"""One weighted mixture over any component (plans/windows/blend.py): a toy kind of component mixes with no
new mixture code, and the sample mixture and the mixture of pretraining sequences are the same blend plus
what a stream position means to them."""

from __future__ import annotations

import pytest
from test_batching_mixtures import plain_quotas
from test_batching_sequence_mixtures import _parts, pinned_sample_mixture

from umlos_cuda import errors
from umlos_cuda.batching.plans.windows.blend import Blend, Part
from umlos_cuda.batching.plans.windows.sequence_mixture import SequenceMixture
from umlos_cuda.errors import UmlosError


class Verses:
    """A toy kind of component: a stream of lines of a poem, one epoch the poem read forwards, the next backwards.
    Nothing in the mixture knows it; the blend only asks how many lines one epoch holds."""

    def __init__(self, lines: list[str]) -> None:
        self.lines = lines

    def at(self, epoch: int, j: int) -> str:
        return self.lines[j] if epoch % 2 == 0 else self.lines[-1 - j]


def test_a_toy_component_mixes_without_new_mixture_code():
    poems = {"sea": Verses([f"sea {i}" for i in range(5)]), "hill": Verses([f"hill {i}" for i in range(3)])}
    blend = Blend((Part(2, 5, None, "sea"), Part(1, 3, 2, "hill")), window=6, num_samples=20, seed=9)
    names = [part.name for part in blend.parts]
    read = []
    for k in range(blend.total):
        i, epoch, j = blend.locate(k)
        read.append(poems[names[i]].at(epoch, j))
    hills = [line for line in read if line.startswith("hill")]
    seas = [line for line in read if line.startswith("sea")]
    # the capped component gives its two epochs (forwards, then backwards) and stops; the other fills the rest
    assert hills == ["hill 0", "hill 1", "hill 2", "hill 2", "hill 1", "hill 0"]
    assert seas == ([f"sea {i}" for i in range(5)] + [f"sea {i}" for i in reversed(range(5))]
                    + [f"sea {i}" for i in range(4)])
    assert len(read) == blend.total == 20
    # every window holds each component at the largest-remainder quota of what is left
    left = [None, 6]
    for m in range(blend.num_windows):
        size = min(6, 20 - 6 * m)
        want = plain_quotas(size, [2, 1], left)
        assert list(blend.quotas(m)) == want
        left[1] -= want[1]


def test_the_sample_mixture_is_the_blend_plus_each_components_order():
    definition = pinned_sample_mixture()
    comps = definition.components
    blend = Blend(tuple(Part(c.weight, c.source.count, c.max_epochs, c.name) for c in comps), 16, 150, 7)
    assert blend.segments == definition.segments and blend.total == definition.total
    for k in range(definition.total):
        window = definition.window_of(k // 16)
        i, epoch, j = blend.locate(k)
        assert (i, epoch) == (int(window.component[k % 16]), int(window.epoch[k % 16]))
        assert definition.sample(k) == (i, epoch, int(window.row[k % 16]))
        _, rows = definition.stream_rows(i, epoch * comps[i].source.count, comps[i].source.count)
        assert rows[j] == window.row[k % 16]


def test_the_mixture_of_sequences_is_the_blend_plus_each_components_cut():
    mixture = SequenceMixture.build(_parts(), 10, 120, 3)
    blend = Blend(tuple(Part(c.weight, s, c.max_epochs, c.name) for c, s in zip(mixture.components,
                                                                                mixture.per_epoch)), 10, 120, 3)
    assert [mixture.locate(k) for k in range(mixture.total)] == [blend.locate(k) for k in range(blend.total)]
    assert tuple(c.sequences.num_epochs for c in mixture.components) == blend.epochs_read()


@pytest.mark.parametrize("parts, match", [
    ((), "1 to 4096 components"),
    ((Part(0, 3), Part(1, 3, None, "b")), "component 0 weight must be a finite number > 0"),
    ((Part(True, 3),), "component 0 weight must be a finite number > 0"),
    ((Part(1, 0, 1, "x"),), "component 0 \\('x'\\) positions per epoch"),
    ((Part(1, 3, 0),), "component 0 max_epochs"),
    ((Part(1, 3, 1, "a"), Part(1, 3, 1, "a")), "names must differ"),
])
def test_every_kind_of_mixture_is_refused_by_the_same_rules(parts, match):
    with pytest.raises(UmlosError, match=match) as caught:
        Blend(parts, 4, 10, 0)
    assert caught.value.code == errors.BATCHING_CONFIG_INVALID


def test_an_endless_mixture_needs_a_total():
    with pytest.raises(UmlosError, match="needs max_epochs on every component"):
        Blend((Part(1, 3, None, "a"), Part(1, 3, 2, "b")), 4, None, 0)
    assert Blend((Part(1, 3, 1, "a"), Part(1, 3, 2, "b")), 4, None, 0).total == 9


def test_a_total_past_what_the_components_hold_is_refused_before_any_allocation(tmp_path, capsys):
    """``--num-samples 10^12`` over a few hundred samples reads a component for billions of epochs: every
    mixture refuses it when the blend is made (``plan build --mix`` once allocated a 582 GiB index for it,
    ``plan cut --mix`` refused it), and a total within 2^16 epochs of every component still mixes."""
    import numpy as np

    from umlos_cuda.batching import LengthCache
    from umlos_cuda.batching.plans.builder import MAX_EPOCHS
    from umlos_cuda.cli import main

    with pytest.raises(UmlosError, match=r"component 'a' would be read for \d+ epochs; at most 65536") as caught:
        Blend((Part(0.7, 300, None, "a"), Part(0.3, 300, None, "b")), 64, 10**12, 0)
    assert caught.value.code == errors.BATCHING_CONFIG_INVALID
    assert Blend((Part(1, 3, None, "a"),), 4, 3 * MAX_EPOCHS, 0).epochs_read() == (MAX_EPOCHS,)
    with pytest.raises(UmlosError, match="would be read for 65537 epochs"):
        Blend((Part(1, 3, None, "a"),), 4, 3 * MAX_EPOCHS + 1, 0)
    lengths = tmp_path / "lengths.jsonl"
    LengthCache.from_arrays(None, np.arange(1, 301, dtype=np.uint32) % 200 + 1, "t").write(lengths)
    status = main(["plan", "build", "--window", "64", "--mix", f"{lengths}:0.7", f"{lengths}:0.3", "--bucket-edges",
                   "32,64,128", "--overflow-max", "256", "--token-budget", "512", "--num-samples", str(10**12),
                   "--output", str(tmp_path / "mixed"), "--quiet"])
    assert status == 2 and capsys.readouterr().err.startswith(f"error {errors.BATCHING_CONFIG_INVALID}: component ")
    assert not (tmp_path / "mixed").exists()
