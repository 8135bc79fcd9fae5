#!/usr/bin/env bash
# Runs the whole test suite from a clean checkout: installs what it needs, then lints,
# type-checks and runs pytest (every integration test on Redis 7.x and on Redis 6.2).
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v redis-server >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "installing Debian's redis-server (Redis 7.x) for the test suite" >&2
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
  else
    echo "redis-server is not installed: run 'apt-get install redis-server'" >&2
    exit 2
  fi
fi

python3 -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]'
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
exec .venv/bin/pytest "$@"
