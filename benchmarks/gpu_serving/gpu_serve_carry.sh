#!/usr/bin/env bash
# Builds the git-ignored carries that benchmarks/gpu_serving/gpu_serve_h200.sh takes to the lent H200
# (the `device` tool), from this checkout's venv, so a GPU serve run starts from a clean
# clone:
#   .devcarry/a: whl/ (the server's wheels the device image lacks, at this venv's versions,
#                for the image's CPython 3.12), stub/ (the data files of silero-vad and
#                moonshine-cpp, without their native libraries), q/ (spoken questions);
#   .devcarry/b: Moonshine base-en's encoder/decoder ORT files, gzipped;
#   .devcarry/s: pipecat_stub.tgz (Smart Turn's ONNX file and the metadata that finds it);
#   .devcarry/d: the video model's wheels (diffusers and its needs the image lacks), for
#                benchmarks/video/gpu_video_peer.sh.
# Each carry stays under the 64 MiB a call may take. Needs network to PyPI and espeak-ng.
#   bash benchmarks/gpu_serving/gpu_serve_carry.sh      # then: run phase a with carry [".devcarry/a"]
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
out=.devcarry
grep -qx '/.devcarry/' .git/info/exclude 2>/dev/null || echo '/.devcarry/' >> .git/info/exclude
site=$($PY -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
rm -rf "$out"
mkdir -p $out/a/whl $out/a/stub/silero_vad/data $out/a/stub/moonshine_cpp/models/base-en \
  $out/a/q $out/b $out/s $out/d

# Not in the image's package list (KINDS.md): the API server, WebRTC, IPC, codecs, MCP.
names="aioice aiortc annotated-types av cffi cryptography dnspython fastapi google-crc32c
ifaddr jsonschema jsonschema-specifications mcp msgspec pycparser pydantic pydantic-core
pydantic-settings pyee pyjwt pylibsrtp pyopenssl python-dotenv python-multipart pyzmq
referencing rpds-py soxr sse-starlette starlette typing-inspection uvicorn websockets gguf httpx2
mcp-types opentelemetry-api httpcore2 truststore aiosipua aiortp"
pins=$($PY - $names <<'EOF'
import sys
from importlib.metadata import PackageNotFoundError, version
missing = []
for name in sys.argv[1:]:
    try:
        print(f"{name}=={version(name)}")
    except PackageNotFoundError:
        missing.append(name)
if missing:
    sys.exit(f"not installed in this venv: {' '.join(missing)}")
EOF
)
platforms=""
for n in 39 35 34 31 28 27 24 17 5; do platforms+=" --platform manylinux_2_${n}_x86_64"; done
# shellcheck disable=SC2086  # word splitting of the pins and platforms is meant
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  $platforms --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d $out/a/whl $pins
video=$($PY -c 'from importlib.metadata import version as v
print(" ".join(f"{n}=={v(n)}" for n in ("diffusers", "ftfy", "wcwidth", "importlib-metadata", "zipp")))')
# shellcheck disable=SC2086
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  $platforms --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d $out/d $video

cp "$site/silero_vad/data/silero_vad.onnx" $out/a/stub/silero_vad/data/
touch $out/a/stub/silero_vad/__init__.py
cp "$site/moonshine_cpp/models/base-en/tokenizer.bin" $out/a/stub/moonshine_cpp/models/base-en/
# voxline bench's own questions and voices (voxline/bench.py), spoken here: no espeak there
$PY - "$out/a/q" <<'EOF'
import subprocess, sys
from voxline.bench import ESPEAK_VOICES, QUESTIONS
for i, text in enumerate(QUESTIONS):
    voice, wpm = ESPEAK_VOICES[i % len(ESPEAK_VOICES)]
    subprocess.run(["espeak-ng", "-v", voice, "-s", str(wpm), "-w", f"{sys.argv[1]}/q{i}.wav",
                    text], check=True, capture_output=True)
EOF
gzip -c "$site/moonshine_cpp/models/base-en/encoder_model.ort" > $out/b/enc.ort.gz
gzip -c "$site/moonshine_cpp/models/base-en/decoder_model_merged.ort" > $out/b/dec.ort.gz
dist=$(cd "$site" && ls -d pipecat_ai-*.dist-info)
tar czf $out/s/pipecat_stub.tgz -C "$site" pipecat/audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx \
  "$dist/METADATA" "$dist/RECORD"
du -sh $out/*
