"""Developer entry point of the benchmark: same as ``canon bench``.

.venv/bin/python scripts/bench.py [--quick] [--json FILE]
"""

import sys

from canon.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
