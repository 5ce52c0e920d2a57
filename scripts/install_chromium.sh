#!/usr/bin/env bash
# Debian's headless-capable Chromium for tests/integration/test_report.py (it opens the report page and keeps a
# screenshot).
exec bash "$(dirname "$0")/install_debian_tools.sh" install_chromium chromium chromium
