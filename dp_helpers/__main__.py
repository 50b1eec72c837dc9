"""`python -m dp_helpers train | doctor | bench`: the tool's command line (dp_helpers/tool/cli.py)."""

import sys

from dp_helpers.tool.cli import main

if __name__ == "__main__":
    sys.exit(main())
