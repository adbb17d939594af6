"""The package's version, in a module of its own.

``umlos_cuda/__init__.py`` imports the whole public surface, so a module of a
lower layer that needs the version (the checkpoint header records it) reads it
here instead of importing the package above it (docs/architecture.md,
"Layers"). ``pyproject.toml`` declares the same version for the distribution.
"""

__version__ = "0.1.0"
