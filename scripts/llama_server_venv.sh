#!/usr/bin/env bash
# Creates (once) the virtualenv holding llama.cpp's OpenAI-compatible server
# (llama-cpp-python[server]) that the remote-LLM tests (tests/test_remote_llm_llamacpp.py)
# and benchmarks/cpu_latency/bench_remote_llm.py start on 127.0.0.1, serving the shipped SmolLM2 GGUF.
#
# llama-cpp-python ships as an sdist: pip compiles llama.cpp (several minutes on 2 cores),
# so the venv is cached outside the repo and rebuilt only when the pins change. The build is
# CPU-only (no CUDA/Metal probing), without -march=native (the cache may be reused on another
# host of the same kind) but with the AVX2/FMA/F16C kernels every x86-64 host here has, and
# without the multimodal (mtmd/llava) library the server never loads for a text model; it
# runs under `nice` so a parallel test run keeps its cores. It stays out of `make run`.
#
# Idempotent and quiet: a second run with the same pins returns in well under a second.
# Prints the venv's python path on the last line of stdout.
#   LLAMA_SERVER_VENV  venv path (default: ${VOXLINE_CACHE:-~/.cache/voxline}/llama-server-venv)
#   PYTHON             interpreter to build it from (default: python3.11, else python3)
set -euo pipefail

CACHE=${VOXLINE_CACHE:-$HOME/.cache/voxline}
VENV=${LLAMA_SERVER_VENV:-$CACHE/llama-server-venv}
PYTHON=${PYTHON:-$(command -v python3.11 || command -v python3)}

PINS=(
  "llama-cpp-python[server]==0.3.36"
)
CMAKE_FLAGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
-DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DGGML_OPENMP=OFF \
-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_CURL=OFF \
-DLLAVA_BUILD=OFF"
SPEC="$( (printf '%s\n' "${PINS[@]}"; echo "$CMAKE_FLAGS") | sha256sum | cut -c1-16)"
STAMP="$VENV/.voxline-llama-server-$SPEC"

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

trap 'echo "[llama-server-venv] failed (exit $?) at: $BASH_COMMAND" >&2' ERR
start=$(date +%s)
echo "[llama-server-venv] building llama-cpp-python (compiles llama.cpp, minutes on 2 cores)" >&2
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip >&2
# CMAKE_BUILD_PARALLEL_LEVEL: both cores, at low priority. --no-cache-dir: pip's wheel cache
# keys on the sdist, not on CMAKE_ARGS, so a cached wheel would ignore changed build flags.
CMAKE_ARGS="$CMAKE_FLAGS" FORCE_CMAKE=1 CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
  nice -n 10 "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-cache-dir \
  --no-binary llama-cpp-python "${PINS[@]}" 2>&1 \
  | { grep -v "is ignored: it is neither a file nor a directory" || true; } >&2
"$VENV/bin/python" -c "import importlib.util as u
import llama_cpp, llama_cpp.server.app
assert u.find_spec('torch') is None, 'torch was pulled in'" >&2
touch "$STAMP"
echo "[llama-server-venv] ready in $(( $(date +%s) - start )) s ($(du -sh "$VENV" | cut -f1))" >&2
echo "$VENV/bin/python"
