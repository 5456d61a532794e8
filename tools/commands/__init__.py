"""The ``kraft`` subcommand groups: each module adds its parsers with ``register(subparsers)``."""
