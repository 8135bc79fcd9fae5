"""Developer entry point of every benchmark (their code: canon/bench/).

.venv/bin/python scripts/bench.py [--quick] [--json FILE]  the benchmark: same as ``canon bench``
.venv/bin/python scripts/bench.py governed [...]           a governed call's dispatch permit
.venv/bin/python scripts/bench.py mcp-proxy [...]          what ``canon mcp-proxy`` costs a host
.venv/bin/python scripts/bench.py cluster-write [...]      CPU per invocation, cluster vs single

Each of the last three takes ``--help``; docs/performance.md says what each measures.
"""

import sys
from collections.abc import Callable

from canon.bench import cluster_write, governed, proxy_cost
from canon.cli import main

#: The measurements beside the main benchmark, by the first argument that asks for one.
MEASUREMENTS: dict[str, Callable[[list[str]], int]] = {
    "governed": governed.main,
    "mcp-proxy": proxy_cost.main,
    "cluster-write": cluster_write.main,
}

if __name__ == "__main__":
    if sys.argv[1:2] and sys.argv[1] in MEASUREMENTS:
        sys.exit(MEASUREMENTS[sys.argv[1]](sys.argv[2:]))
    sys.exit(main(["bench", *sys.argv[1:]]))
