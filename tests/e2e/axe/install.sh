#!/usr/bin/env bash
# axe-core (pinned by package.json / package-lock.json beside this script) for the console's
# accessibility check in the browser tests (tests/support/axe.py). `.ci/run` runs this; so
# does `make screenshots`. The tests fail (never skip) when it is missing.
set -euo pipefail
cd "$(dirname "$0")"
command -v npm >/dev/null 2>&1 || { echo "npm is required (deploy/system-packages.sh installs it)" >&2; exit 1; }
npm ci --no-audit --no-fund --loglevel=error
test -s node_modules/axe-core/axe.min.js
