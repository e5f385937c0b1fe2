"""One module per `mnngpu` subcommand; see mnngpu/cli.py."""
