#!/usr/bin/env bash
# Install Debian's headless-capable Chromium for tests/integration/test_report.py (it opens the report page and keeps a
# screenshot). Idempotent: does nothing when chromium is already on PATH. Needs root (CI runs as root).
set -euo pipefail

if command -v chromium >/dev/null 2>&1; then
    echo "install_chromium: $(chromium --version 2>/dev/null | head -1) already installed"
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "install_chromium: must run as root (apt-get install); re-run with sudo" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends chromium
command -v chromium >/dev/null 2>&1 || { echo "install_chromium: chromium still missing after install" >&2; exit 1; }
echo "install_chromium: done ($(chromium --version 2>/dev/null | head -1))"
