"""The presets of docs/spec/nextbatch-v2.md §5: ``train_shuffle``, ``eval_sequential``, ``streaming_infinite``.

The first two are names for what ``stage`` already selects. The third is the
one mode that crosses epoch boundaries: the stream is epoch e's train sequence
followed by epoch e+1's, and so on ("wrap-around with epoch seed rotation"), so
a global batch that runs past N takes the rest of epoch e and the head of epoch
e+1. It never drops and never repeats a sample within an epoch. Because it is a
different sequence from ``train`` near epoch ends, it has its own
``sampling_mode`` string (each sampling mode names one) and hence its own
``sampler_config_hash``; ``drop_last`` does not apply and is hashed as false.
docs/spec/nextbatch-v2.md §5 is the normative description.
:func:`umlos_cuda.sampler.resolve_sampler` turns a preset (or a stage) and a
manifest into the sampler a call runs.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import checks, errors
from .modes import block_affine

#: The stages of NextBatch_v2: ``train`` is shuffled, ``eval`` and ``infer`` sequential.
STAGES = ("train", "eval", "infer")
#: The default mode's streaming ``sampling_mode`` (modes/block_affine.py), under its earlier name.
MODE_STREAMING = block_affine.STREAMING_MODE


@dataclass(frozen=True, slots=True)
class Preset:
    name: str | None
    stage: str
    streaming: bool = False


PRESETS = {
    "train_shuffle": Preset("train_shuffle", "train"),
    "eval_sequential": Preset("eval_sequential", "eval"),
    "streaming_infinite": Preset("streaming_infinite", "train", streaming=True),
}


def resolve_preset(preset: str | None, stage: str) -> Preset:
    """The preset called ``preset``, or the plain ``stage`` when none is named.

    INVALID_STAGE_TYPE for an unknown preset or a stage outside STAGES.
    """
    fail = checks.raising(errors.INVALID_STAGE_TYPE, operator=errors.NEXTBATCH_OPERATOR)
    if preset is None:
        resolved = Preset(None, stage)
    else:
        resolved = PRESETS[checks.choice(preset, "preset", PRESETS, fail=fail,
                                         message="unknown {name} {value!r}; choose one of {choices}")]
    checks.choice(resolved.stage, "stage", STAGES, fail=fail, message="{name} {value!r} is not one of {choices}")
    return resolved
