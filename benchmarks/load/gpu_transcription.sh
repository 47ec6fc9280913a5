#!/usr/bin/env bash
# Device driver for gpu_transcription.py on one lent GPU (the `device` tool): live
# transcription streams against `voxline serve` with its ASR on the GPU.
# Carries come from benchmarks/gpu_serving/gpu_serve_carry.sh (run it here first):
#   whisper   (carry [".devcarry/a", ".devcarry/s"], ONE call): the server's wheels and the
#             stubs of silero-vad / moonshine-cpp (data files) -> /tmp/site, the spoken
#             questions (.devcarry/a/q), Smart Turn's package stub; builds the random
#             whisper-large-v3-turbo and Qwen3-TTS checkpoints in /tmp/ckpt, serves with
#             --asr whisper:/tmp/ckpt/asr on cuda, ramps the levels.
#   moonshine (carry [".devcarry/b", ".devcarry/s"], on the machine a `whisper` call left
#             warm): Moonshine's ORT files -> /tmp/site, then the same ramp with the
#             shipped Moonshine on the GPU (torch).
# Extra arguments go to `gpu_transcription.py run` (e.g. --levels 64,128,256,384).
# $OUT gets one archive, run.tgz: server.log, transcription.json, bench.txt, gpu.csv.
set -u
mode=${1:-whisper}; shift || true
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD
site=/tmp/site
base=$site/moonshine_cpp/models/base-en
case $mode in
whisper)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target $site .devcarry/a/whl/*.whl || exit 1
  cp -r .devcarry/a/stub/* $site/ && rm -rf /tmp/q && cp -r .devcarry/a/q /tmp/q
  tar xzf .devcarry/s/pipecat_stub.tgz -C $site || exit 1
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 benchmarks/load/gpu_transcription.py build /tmp/ckpt && du -sh /tmp/ckpt/* || exit 1
  python3 benchmarks/load/gpu_transcription.py run /tmp/ckpt --asr whisper --out "$OUT/whisper" \
    --audio-dir /tmp/q "$@"
  ;;
moonshine)
  [ -d /tmp/ckpt/tts ] || { echo "fresh machine: run the whisper mode first"; exit 3; }
  [ -f .devcarry/s/pipecat_stub.tgz ] && tar xzf .devcarry/s/pipecat_stub.tgz -C $site
  gunzip -c .devcarry/b/enc.ort.gz > $base/encoder_model.ort || exit 1
  gunzip -c .devcarry/b/dec.ort.gz > $base/decoder_model_merged.ort || exit 1
  python3 benchmarks/load/gpu_transcription.py run /tmp/ckpt --asr moonshine \
    --out "$OUT/moonshine" --audio-dir /tmp/q "$@"
  ;;
*)
  echo "usage: $0 whisper|moonshine [gpu_transcription.py run flags]"; exit 2
  ;;
esac
rc=$?
if [ -n "${OUT:-}" ] && [ -n "$(ls -A "$OUT")" ]; then
  tar czf /tmp/run.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/run.tgz "$OUT/"
fi
exit $rc
