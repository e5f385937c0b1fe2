"""`python -m mnngpu`: the same command line as the `mnngpu` script."""

import sys

from mnngpu.apps.cli import main

sys.exit(main())
