#!/usr/bin/env bash
# Debian packages the test-suite, `make serve` and `make bench` use; installs the missing ones
# (pgbouncer: tests/e2e/test_connection_budget.py runs the app behind it in transaction mode;
# fonts-dejavu-core: the Unicode font of invoice PDFs, INVOICE_FONT_PATH's default).
set -euo pipefail
need=()
for pkg in nginx wrk chromium pgbouncer fonts-dejavu-core; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
# node: the OpenAPI tests check the published patterns with ECMA-262's own engine (the
# machine image ships one; Debian's nodejs otherwise)
command -v node >/dev/null 2>&1 || need+=("nodejs")
# npm: axe-core for the console's accessibility check (tests/e2e/axe/install.sh)
command -v npm >/dev/null 2>&1 || need+=("npm")
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "missing Debian packages: ${need[*]} (install them as root)" >&2; exit 1
  fi
  echo "installing: ${need[*]}"
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
