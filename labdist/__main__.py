"""`python -m labdist`: the command line (labdist/cli/)."""

import sys

from labdist.cli import main

if __name__ == "__main__":
    sys.exit(main())
