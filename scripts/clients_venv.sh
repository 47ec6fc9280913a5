#!/usr/bin/env bash
# Creates (once) the virtualenv holding the third-party realtime clients that
# tests/test_third_party_clients.py drives against a live voxline server: pipecat
# (OpenAIRealtimeLLMService), the OpenAI Agents SDK (RealtimeRunner) and LiveKit Agents'
# OpenAI plugin (openai.realtime.RealtimeModel).
#
# Their pins (openai 2.x, websockets, numba...) differ from voxline's own venv, so they live
# in a separate venv, cached outside the repo. None needs torch; the check below fails
# the build if something pulls it in anyway (a bare `torch` is a multi-GB CUDA download).
#
# Idempotent and quiet: a second run with the same pins returns in well under a second.
# Prints the venv's python path on the last line of stdout.
#   CLIENTS_VENV   venv path (default: ${VOXLINE_CACHE:-~/.cache/voxline}/clients-venv)
#   PYTHON         interpreter to build it from (default: python3.11, else python3)
set -euo pipefail

CACHE=${VOXLINE_CACHE:-$HOME/.cache/voxline}
VENV=${CLIENTS_VENV:-$CACHE/clients-venv}
PYTHON=${PYTHON:-$(command -v python3.11 || command -v python3)}

# pipecat's `openai` extra is what its OpenAI Realtime service imports (openai + websockets).
PINS=(
  "pipecat-ai[openai]==1.14.0"
  "openai-agents==0.24.0"
  "livekit-agents==1.8.9"
  "livekit-plugins-openai==1.8.9"
)
SPEC="$(printf '%s\n' "${PINS[@]}" | sha256sum | cut -c1-16)"
STAMP="$VENV/.voxline-clients-$SPEC"

if [ -f "$STAMP" ] && [ -x "$VENV/bin/python" ]; then
  echo "$VENV/bin/python"
  exit 0
fi

mkdir -p "$(dirname "$VENV")"
exec 9>"$VENV.lock"
flock 9
# Another process may have finished the job while this one waited for the lock.
if [ -f "$STAMP" ]; then
  echo "$VENV/bin/python"
  exit 0
fi

trap 'echo "[clients-venv] failed (exit $?) at: $BASH_COMMAND" >&2' ERR
start=$(date +%s)
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
# Drop pip's notes about configured local indexes that lack a package; keep the rest.
"$VENV/bin/python" -m pip install -q --disable-pip-version-check "${PINS[@]}" 2>&1 \
  | { grep -v "is ignored: it is neither a file nor a directory" || true; } >&2
"$VENV/bin/python" -c "import importlib.util as u
from pipecat.services.openai.realtime.llm import OpenAIRealtimeLLMService
from agents.realtime import RealtimeRunner
from livekit.plugins.openai.realtime import RealtimeModel
assert u.find_spec('torch') is None, 'torch was pulled in'" >&2
touch "$STAMP"
echo "[clients-venv] ready in $(( $(date +%s) - start )) s ($(du -sh "$VENV" | cut -f1))" >&2
echo "$VENV/bin/python"
