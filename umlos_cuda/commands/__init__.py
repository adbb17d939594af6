"""One module per ``umlos-cuda`` subcommand; each defines ``register(subparsers)``."""
