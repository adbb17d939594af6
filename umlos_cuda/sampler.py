"""One sampler resolution: which order a call runs, under which strings and hash.

Three inputs decide it: the manifest (its sampling mode, ``sampler_block_size``
and ``drop_last``), the stage and the preset. :func:`resolve_sampler` is the one
place that combines them, for ``next_batch`` and ``epoch_indices`` and for the
checkpoint identity, so the ``sampler_config_hash`` a checkpoint binds is the
one its calls report:

* ``train`` runs the manifest's sampling mode (``umlos_cuda.modes``); ``eval``
  and ``infer`` are sequential (positions are indices) whatever the mode;
* ``streaming_infinite`` is the train order carried across epochs, with the
  mode's streaming ``sampling_mode`` string, and never drops (``drop_last``
  false);
* ``sampler_config_hash`` (R9) hashes the ``sampling_mode`` string, the block
  size, ``drop_last`` and the mode's tokens.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from .hashing import hash_canonical
from .manifest.core import Manifest
from .modes import DEFAULT_MODE, SEQUENTIAL_MODE, SamplingMode, get_mode
from .presets import resolve_preset


@dataclass(frozen=True, slots=True)
class SamplerConfig:
    """The sampler of a call, resolved (see :func:`resolve_sampler`).

    Args:
        preset: the preset's name, or None when the call named a stage.
        stage: ``train``, ``eval`` or ``infer``.
        streaming: the ``streaming_infinite`` preset (crosses epoch boundaries).
        mode: the train order, a registered :class:`~umlos_cuda.modes.SamplingMode`.
        block_size: the manifest's ``sampler_block_size``.
        drop_last: the manifest's ``drop_last``, false under streaming.
    """

    preset: str | None
    stage: str
    streaming: bool
    mode: SamplingMode
    block_size: int
    drop_last: bool

    @property
    def shuffled(self) -> bool:
        """Whether positions go through the mode's order (train) or are the indices (eval, infer)."""
        return self.stage == "train"

    @property
    def sampling_mode(self) -> str:
        """The R9 ``sampling_mode`` of this sampler."""
        if self.streaming:
            return self.mode.streaming_sampling_mode
        return self.mode.train_sampling_mode if self.shuffled else SEQUENTIAL_MODE

    @property
    def config_hash(self) -> bytes:
        """R9 ``sampler_config_hash`` (32 bytes)."""
        return sampler_config_hash(self.sampling_mode, self.block_size, self.drop_last, mode=self.mode.name)


def resolve_sampler(manifest: Manifest, stage: str, preset: str | None = None, *,
                    mode: str | None = None) -> SamplerConfig:
    """The sampler of a call on ``manifest`` with ``stage`` or ``preset`` (the preset wins).

    ``mode`` names a registered sampling mode; None takes the manifest's
    ``data.sampling_mode`` (``block_affine`` when it names none). Raises INVALID_STAGE_TYPE for
    an unknown preset or stage and INVALID_MANIFEST for an unknown mode, naming
    the allowed values.
    """
    resolved = resolve_preset(preset, stage)
    return SamplerConfig(
        preset=resolved.name,
        stage=resolved.stage,
        streaming=resolved.streaming,
        mode=get_mode(manifest.sampling_mode if mode is None else mode),
        block_size=manifest.sampler_block_size,
        drop_last=manifest.drop_last and not resolved.streaming,
    )


def sampler_config_hash(sampling_mode: str, sampler_block_size: int, drop_last: bool, *,
                        mode: str = DEFAULT_MODE) -> bytes:
    """R9 ``sampler_config_hash`` (32 bytes) with the config tokens of sampling mode ``mode``."""
    return _config_hash(sampling_mode, sampler_block_size, drop_last, get_mode(mode).config_tokens)


@functools.lru_cache(maxsize=64)
def _config_hash(sampling_mode: str, sampler_block_size: int, drop_last: bool, tokens: tuple[str, ...]) -> bytes:
    return hash_canonical([sampling_mode, sampler_block_size, drop_last, *tokens])
