#!/usr/bin/env bash
# Installs what the MCP conformance test needs into .conformance/ (never globally): Node 22
# (npm's node@22 package) when no Node >= 22 is on PATH, and two releases of the official
# conformance suite side by side: 0.2.0-alpha.12 (protocols 2025-11-25 and 2026-07-28, as
# .conformance/node_modules/conformance-next) and 0.1.16 (as conformance-0116).
# tests/integration/mcp/test_conformance.py finds them there; without them it is skipped
# with one line. Pass --check to only say whether they are installed.
set -euo pipefail
cd "$(dirname "$0")/.."

NEXT_VERSION=0.2.0-alpha.12
OLD_VERSION=0.1.16
DIR=.conformance
NEXT="$DIR/node_modules/conformance-next/dist/index.js"
OLD="$DIR/node_modules/conformance-0116/dist/index.js"

node_major() { "$1" --version 2>/dev/null | sed -E 's/^v([0-9]+).*/\1/'; }
installed_version() {
  sed -nE 's/^  "version": "([^"]+)",?$/\1/p' "$DIR/node_modules/$1/package.json" 2>/dev/null | head -1
}
suites_installed() {
  [ -f "$NEXT" ] && [ -f "$OLD" ] &&
    [ "$(installed_version conformance-next)" = "$NEXT_VERSION" ] &&
    [ "$(installed_version conformance-0116)" = "$OLD_VERSION" ]
}

if [ "${1:-}" = "--check" ]; then
  suites_installed && echo "conformance suites: $NEXT, $OLD" && exit 0
  echo "conformance suites not installed: run scripts/conformance.sh" >&2
  exit 1
fi

local_node="$DIR/node_modules/.bin/node"
if suites_installed && { [ "$(node_major "$local_node" || echo 0)" -ge 22 ] 2>/dev/null ||
  [ "$(node_major node || echo 0)" -ge 22 ] 2>/dev/null; }; then
  exit 0  # already installed
fi

if ! command -v npm >/dev/null 2>&1; then
  echo "no npm: the MCP conformance test will be skipped" >&2
  exit 0
fi
mkdir -p "$DIR"
packages=(
  "conformance-next@npm:@modelcontextprotocol/conformance@$NEXT_VERSION"
  "conformance-0116@npm:@modelcontextprotocol/conformance@$OLD_VERSION"
)
if ! command -v node >/dev/null 2>&1 || [ "$(node_major node)" -lt 22 ]; then
  packages+=("node@22")
fi
if ! npm install --silent --no-audit --no-fund --prefix "$DIR" "${packages[@]}" >/dev/null; then
  echo "could not install Node 22 and the MCP conformance suites: the test will be skipped" >&2
fi
