import sys

from mnngpu.cli import main

sys.exit(main())
