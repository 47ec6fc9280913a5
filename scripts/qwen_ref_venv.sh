#!/usr/bin/env bash
# Creates (once) the virtualenv that runs the official Qwen3-TTS reference (`qwen-tts`),
# used only by the parity tests in tests/test_qwen3_tts*.py.
#
# qwen-tts pins transformers==4.57.3 (voxline uses transformers 5), so it lives in its own
# venv, cached outside the repo. Only what its talker and 12 Hz codec classes import is
# installed: its CLI/demo (gradio), the 25 Hz tokenizer's extras (sox, torchaudio, whose
# PyPI build is CUDA-linked) and accelerate are left out; tests/qwen_ref/_compat.py stubs
# the modules the package imports but the parity tests never run.
#
# Idempotent and quiet: a second run with the same pins returns in well under a second.
# Prints the venv's python path on the last line of stdout.
#   QWEN_REF_VENV   venv path (default: ${VOXLINE_CACHE:-~/.cache/voxline}/qwen-ref-venv)
#   PYTHON          interpreter to build it from (default: python3.11, else python3)
set -euo pipefail

CACHE=${VOXLINE_CACHE:-$HOME/.cache/voxline}
VENV=${QWEN_REF_VENV:-$CACHE/qwen-ref-venv}
PYTHON=${PYTHON:-$(command -v python3.11 || command -v python3)}

# torch: the CPU wheel voxline pins (an unpinned torch would pull a multi-GB CUDA build).
PINS=(
  "torch==2.13.0"
  "transformers==4.57.3"
  "librosa==0.11.0"
  "soundfile>=0.12"
  "einops>=0.8"
)
QWEN_TTS="qwen-tts==0.1.1"
SPEC="$(printf '%s\n' "${PINS[@]}" "$QWEN_TTS" | sha256sum | cut -c1-16)"
STAMP="$VENV/.voxline-qwen-ref-$SPEC"

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

trap 'echo "[qwen-ref-venv] failed (exit $?) at: $BASH_COMMAND" >&2' ERR
start=$(date +%s)
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
pip_install() {
  # Drop pip's notes about configured local indexes that lack a package; keep the rest.
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check "$@" 2>&1 \
    | { grep -v "is ignored: it is neither a file nor a directory" || true; } >&2
}
pip_install "${PINS[@]}"
# --no-deps: its declared deps include gradio, torchaudio, sox and accelerate (see above).
pip_install --no-deps "$QWEN_TTS"
# Importing qwen_tts itself needs the stubs; check the installed pieces without running it.
"$VENV/bin/python" -c "import importlib.util as u, torch, transformers, librosa
assert u.find_spec('qwen_tts') is not None" >&2
touch "$STAMP"
echo "[qwen-ref-venv] ready in $(( $(date +%s) - start )) s ($(du -sh "$VENV" | cut -f1))" >&2
echo "$VENV/bin/python"
