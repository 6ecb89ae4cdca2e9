#!/usr/bin/env bash
# Makes sure headless Chromium is available for the HTML report tests (tests/report/test_report_html.py
# renders reports/<job>/index.html in it and takes a screenshot). Installs Debian's `chromium`
# package with apt-get when `chromium` is not on PATH and we are root; otherwise it only says why
# it did nothing (the tests that need the browser then skip with that reason). Never fails the
# build: a machine without apt or without root still runs every other test.
set -u
if command -v chromium >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" != "0" ]; then
    echo "ensure_chromium: chromium is not installed and we are not root; the browser tests will skip" >&2
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "ensure_chromium: chromium is not installed and apt-get is missing; the browser tests will skip" >&2
    exit 0
fi
echo "ensure_chromium: installing Debian's chromium package (once)" >&2
export DEBIAN_FRONTEND=noninteractive
# Wait for a concurrent apt/dpkg run instead of failing on its lock.
apt-get -o DPkg::Lock::Timeout=600 update -qq >/dev/null \
    && apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null \
    || echo "ensure_chromium: apt-get could not install chromium; the browser tests will skip" >&2
exit 0
