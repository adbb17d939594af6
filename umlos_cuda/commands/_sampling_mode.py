"""``--order`` (formerly ``--sampling-mode``): run a command's manifest under another train order.

The manifest's ``data.sampling_mode`` (docs/manifest.md) is where a run's
order is named, and it is part of ``manifest_hash``. The option therefore does
what editing that key would do: the command runs a copy of the manifest that
names the mode, with that copy's hash, replay token and
``sampler_config_hash``, so its output is what the edited manifest file would
give. An unknown mode is INVALID_MANIFEST naming the registered ones (the
manifest's own check).
"""

from __future__ import annotations

from ..manifest.core import Manifest
from ._args import add_option
from ..modes import DEFAULT_MODE, mode_names

HELP = (f"the train order: {', '.join(mode_names())} (default: the manifest's data.sampling_mode, else {DEFAULT_MODE}; "
        "docs/sampling-modes.md says which to pick). It runs the manifest as if it named this mode, hash included")


def add_sampling_mode_argument(parser) -> None:
    add_option(parser, "--order", old=("--sampling-mode",), dest="sampling_mode", default=None, metavar="MODE",
               help=HELP)


def with_sampling_mode(manifest: Manifest, mode: str | None) -> Manifest:
    """``manifest`` with ``data.sampling_mode = mode`` (``manifest`` itself when ``mode`` is None)."""
    if mode is None:
        return manifest
    raw = manifest.to_dict()
    raw.setdefault("data", {})["sampling_mode"] = mode
    return Manifest.from_dict(raw)
