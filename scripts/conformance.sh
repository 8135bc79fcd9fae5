#!/usr/bin/env bash
# Installs what the MCP conformance test needs into .conformance/ (never globally): Node 22
# (npm's node@22 package) when no Node >= 22 is on PATH, and the official conformance
# suite. tests/integration/test_mcp_conformance.py finds them there; without them it is
# skipped with one line. Pass --check to only say whether they are installed.
set -euo pipefail
cd "$(dirname "$0")/.."

SUITE_VERSION=0.1.16
DIR=.conformance
SUITE="$DIR/node_modules/@modelcontextprotocol/conformance/dist/index.js"

node_major() { "$1" --version 2>/dev/null | sed -E 's/^v([0-9]+).*/\1/'; }

if [ "${1:-}" = "--check" ]; then
  [ -f "$SUITE" ] && echo "conformance suite: $SUITE" && exit 0
  echo "conformance suite not installed: run scripts/conformance.sh" >&2
  exit 1
fi

local_node="$DIR/node_modules/.bin/node"
if [ -f "$SUITE" ] && { [ "$(node_major "$local_node" || echo 0)" -ge 22 ] 2>/dev/null ||
  [ "$(node_major node || echo 0)" -ge 22 ] 2>/dev/null; }; then
  exit 0  # already installed
fi

if ! command -v npm >/dev/null 2>&1; then
  echo "no npm: the MCP conformance test will be skipped" >&2
  exit 0
fi
mkdir -p "$DIR"
packages=("@modelcontextprotocol/conformance@$SUITE_VERSION")
if ! command -v node >/dev/null 2>&1 || [ "$(node_major node)" -lt 22 ]; then
  packages+=("node@22")
fi
if ! npm install --silent --no-audit --no-fund --prefix "$DIR" "${packages[@]}" >/dev/null; then
  echo "could not install Node 22 and the MCP conformance suite: the test will be skipped" >&2
fi
