#!/usr/bin/env bash
# Debian packages only the tests need (idempotent): espeak-ng speaks the test questions,
# the web page's end-to-end test drives Chromium with a fake microphone, and the
# two-server test puts HAProxy in front of two servers, and the SIP tests call the server
# with baresip (a real SIP user agent).
set -euo pipefail
need_apt=()
command -v espeak-ng >/dev/null 2>&1 || need_apt+=(espeak-ng)
command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 \
  || need_apt+=(chromium)
command -v haproxy >/dev/null 2>&1 || need_apt+=(haproxy)
command -v baresip >/dev/null 2>&1 || need_apt+=(baresip-core)
[ ${#need_apt[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ]; then
  echo "[test-deps] missing ${need_apt[*]}: install them with apt-get (as root)" >&2
  exit 1
fi
start=$(date +%s)
echo "[test-deps] apt-get install ${need_apt[*]}"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
echo "[test-deps] installed in $(( $(date +%s) - start )) s"
