"""The repository's ``kernels/`` and ``golden/`` folders, wherever this package runs from.

A wheel ships them inside the package as ``umlos_cuda/_kernels`` and
``umlos_cuda/_golden`` (pyproject.toml maps the folders there). A checkout —
an editable install, or the repository root on ``sys.path`` — keeps them at
the top of the repository, beside ``umlos_cuda/``.

They are found by location rather than imported as packages. For them to be
importable in a checkout, ``kernels/`` and ``golden/`` would need an
``__init__.py``, and a folder with one is a top-level package for every
process that has the repository root on ``sys.path`` (``python -m pytest``,
scripts started from the root, torchrun ranks): the checkout's ``kernels``
then hides Hugging Face's ``kernels`` distribution, which ``transformers``
imports. Without the ``__init__.py`` the folders are namespace portions, which
never win over an installed package; setuptools' editable installs cannot map
such a folder to ``umlos_cuda._kernels`` (pypa/setuptools#4943), hence the
lookup by location here.
"""

from __future__ import annotations

from importlib import resources
from importlib.abc import Traversable
from pathlib import Path

__all__ = ["FOLDERS", "bundled_folder"]

#: Each bundled folder of the repository and its name inside an installed package.
FOLDERS = {"kernels": "_kernels", "golden": "_golden"}


def bundled_folder(name: str) -> Traversable:
    """``kernels`` or ``golden``: the installed copy inside the package, else the checkout's folder.

    Raises FileNotFoundError naming both places when neither exists (an install
    made without its package data)."""
    installed = resources.files(__package__).joinpath(FOLDERS[name])
    if installed.is_dir():
        return installed
    checkout = Path(__file__).resolve().parent.parent / name
    if checkout.is_dir():
        return checkout
    raise FileNotFoundError(f"the {name}/ folder is neither in the package ({installed}) nor in a checkout "
                            f"({checkout}); reinstall umlos-cuda")
