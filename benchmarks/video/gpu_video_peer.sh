#!/usr/bin/env bash
# Device driver for bench_video_peer.py (the `device` tool): real-time video through
# `voxline serve` at a real aiortc peer, then voice beside video, on one GPU. Two calls on
# the same warm machine (/tmp persists while it is warm; the carries do not fit one call):
#   phase a (carry .devcarry/a and .devcarry/d; ~4-5 min): the server's and diffusers'
#            wheels -> /tmp/site, the voice checkpoints (bench_gpu_serve.py build:
#            Qwen3-TTS-1.7B and Llama-1B shapes) -> /tmp/ckpt (~1 min),
#            the Helios-Distilled checkpoint (14.3 B transformer, UMT5-XXL, Wan VAE, bf16,
#            random) built on the GPU and saved -> /tmp/helios (~40 GB, ~2-3 min)
#   phase b (carry .devcarry/b and .devcarry/s; <= 10 min): Moonshine's ORT files (ASR on
#            the GPU) and Smart Turn's stub, `voxline serve` with the voice models and the video model (compiled, float8; left running for a later
#            b), ready (~3-5 min cold),
#            a warm-up clip (the compile), the peer arms (1 and 2 streams, 20 s clips,
#            ~2 min), then voxline bench beside 0, 1, 2 videos (~1 min each); an arm that
#            would pass the budget is skipped and noted. Run b again (same warm machine) with
#            e.g. `--streams '' --voice-videos 1,2` for what was skipped.
# .devcarry/{a,b,d,s} come from benchmarks/gpu_serving/gpu_serve_carry.sh. Writes to $OUT one
# archive, run.tgz: peer.json (both tables' numbers, the capacity lines), voice_v*.json
# (voxline bench's own reports), server.log, gpu.csv.
#   bash benchmarks/video/gpu_video_peer.sh a
#   bash benchmarks/video/gpu_video_peer.sh b [bench_video_peer.py flags]
# SERVE_ARGS adds `voxline serve` flags (the server is sized for the 32 voice sessions:
# with the float8 Helios they fit an H100's memory, with bf16 19 do); BUDGET_S (default
# 560) bounds phase b. To restart the server with other flags: kill $(cat /tmp/serve.pid).
set -u
phase=$1; shift
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD
site=/tmp/site
case $phase in
a)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target $site .devcarry/a/whl/*.whl .devcarry/d/*.whl || exit 1
  cp -r .devcarry/a/stub/* $site/ && cp -r .devcarry/a/q /tmp/q
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  df -h /tmp | tail -1
  python3 -c "import av, aiortc, diffusers, voxline.realtime.server, voxline.engines.factory; \
print('imports ok, diffusers', diffusers.__version__)" || exit 1
  SECONDS=0
  python3 benchmarks/gpu_serving/bench_gpu_serve.py build /tmp/ckpt || exit 1
  echo "voice checkpoints in ${SECONDS} s"; SECONDS=0
  python3 benchmarks/video/bench_video_peer.py --build-helios /tmp/helios --out /tmp/unused.json \
    || exit 1
  echo "Helios checkpoint in ${SECONDS} s"; du -sh /tmp/ckpt/* /tmp/helios; df -h /tmp | tail -1
  ;;
b)
  [ -f /tmp/helios/model_index.json ] || { echo "fresh machine: phase a's files are gone"; exit 3; }
  tar xzf .devcarry/s/pipecat_stub.tgz -C $site || exit 1
  base=$site/moonshine_cpp/models/base-en
  gunzip -c .devcarry/b/enc.ort.gz > $base/encoder_model.ort || exit 1
  gunzip -c .devcarry/b/dec.ort.gz > $base/decoder_model_merged.ort || exit 1
  out=${OUT:-/tmp/out}; mkdir -p "$out"
  nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used,memory.total --format=csv -l 1 \
    > "$out/gpu.csv" 2>/dev/null &
  smi=$!
  # The server runs in its own session (setsid), so it outlives this call: a later `b` on
  # the same warm machine (arms skipped for the budget) finds it up and ready.
  if ! { [ -f /tmp/serve.pid ] && kill -0 "$(cat /tmp/serve.pid)" 2>/dev/null; }; then
    # shellcheck disable=SC2086  # SERVE_ARGS splits into flags
    setsid nohup python3 -m voxline.cli serve --port 8765 --ice-hosts 127.0.0.1 --device cuda \
      --tts qwen3:/tmp/ckpt/tts --llm-checkpoint /tmp/ckpt/llm --asr-device cuda \
      --tts-max-frames 100 --video helios:/tmp/helios --video-compile \
      --video-weights fp8 --max-sessions 32 --max-responses 32 --tts-max-streams 32 \
      ${SERVE_ARGS:-} > /tmp/serve.log 2>&1 < /dev/null &
    echo $! > /tmp/serve.pid
  fi
  python3 benchmarks/video/bench_video_peer.py --url http://127.0.0.1:8765 \
    --server-log /tmp/serve.log --out "$out/peer.json" --audio-dir /tmp/q \
    --budget-s "${BUDGET_S:-560}" "$@"
  rc=$?
  kill $smi 2>/dev/null
  cp /tmp/serve.log "$out/server.log"
  tar czf /tmp/run.tgz -C "$out" . && rm -rf "${out:?}"/* && mv /tmp/run.tgz "$out/"
  exit $rc
  ;;
esac
