import sys

from gemmlib.cli import main

sys.exit(main())
