#!/usr/bin/env bash
# Sets up a virtual environment and runs the demo: a simulated agent harness driving
# tools through the store, with an embedded Redis when REDIS_URL is not set.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[embedded]'
exec .venv/bin/canon demo "$@"
