"""One module per ``canon`` subcommand, each with ``register(subparsers)``."""
