"""One module per `mnngpu` subcommand; see mnngpu/apps/cli.py."""
