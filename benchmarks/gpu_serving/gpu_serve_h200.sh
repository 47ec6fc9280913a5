#!/usr/bin/env bash
# Device driver for bench_gpu_serve.py on a lent H200 (the `device` tool): the server's
# wheels and model files travel in two carries because together they pass the 64 MiB a
# call may take, so the work is split over two calls on the same warm machine.
#   phase a (carry .devcarry/a): wheels + stubs of the two model packages -> /tmp/site,
#            the random checkpoints -> /tmp/ckpt, a load check of the GPU models
#   phase b (carry .devcarry/b and .devcarry/s): Moonshine's ORT files and Smart Turn's
#            package stub -> /tmp/site, then serve + bench (without .devcarry/s the engine
#            does not start: pipecat-ai, which holds Smart Turn's ONNX file, is missing)
#   phase s (the same carries as b): start-up times instead (bench_gpu_start.py)
# .devcarry/a: whl/*.whl (python 3.12 manylinux), stub/{silero_vad,moonshine_cpp}/ (data
# files only: silero_vad.onnx, tokenizer.bin), q/*.wav (questions, espeak-ng);
# .devcarry/b: enc.ort.gz, dec.ort.gz (moonshine-cpp's base-en encoder/decoder, gzipped);
# .devcarry/s: pipecat_stub.tgz (Smart Turn's ONNX file and the metadata that finds it).
set -u
phase=$1; shift
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD
site=/tmp/site
base=$site/moonshine_cpp/models/base-en
install_a() {
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target $site .devcarry/a/whl/*.whl || exit 1
  cp -r .devcarry/a/stub/* $site/ && cp -r .devcarry/a/q /tmp/q
}
profiler() {  # "--profile PY_SPY" when a py-spy wheel travels in .devcarry/p (and not NO_PROFILE)
  [ -z "${NO_PROFILE:-}" ] && ls .devcarry/p/py_spy-*.whl >/dev/null 2>&1 || return 0
  [ -x /tmp/spy/bin/py-spy ] || python3 -m pip install -q --no-index --no-deps --no-compile \
    --no-cache-dir --target /tmp/spy .devcarry/p/py_spy-*.whl >&2 || return 0
  echo "--profile /tmp/spy/bin/py-spy"
}
carry_b() {  # phase b's carries into /tmp/site (after phase a on the same machine)
  [ -d /tmp/ckpt/llm ] || { echo "fresh machine: phase a's files are gone"; exit 3; }
  for w in .devcarry/*/*.whl; do  # pipecat-ai (Smart Turn's ONNX file) travels here too
    [ -f "$w" ] && [ "${w#.devcarry/a/}" = "$w" ] && python3 -m pip install -q --no-index \
      --no-deps --no-compile --no-cache-dir --target $site "$w"
  done
  [ -f .devcarry/s/pipecat_stub.tgz ] && tar xzf .devcarry/s/pipecat_stub.tgz -C $site
  [ -f .devcarry/b/enc.ort.gz ] && gunzip -c .devcarry/b/enc.ort.gz > $base/encoder_model.ort
  [ -f .devcarry/b/dec.ort.gz ] && gunzip -c .devcarry/b/dec.ort.gz > $base/decoder_model_merged.ort
  return 0
}
case $phase in
w)
  # One call, GPU ASR: .devcarry/a, plus .devcarry/s/pipecat_stub.tgz (Smart Turn's ONNX
  # file and the package metadata that finds it) and, optionally, a py-spy wheel in
  # .devcarry/p; Moonshine's files are not needed (ASR is Whisper on the GPU).
  install_a
  tar xzf .devcarry/s/pipecat_stub.tgz -C $site || exit 1
  spy=$(profiler)
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 benchmarks/gpu_serving/bench_gpu_serve.py build /tmp/ckpt --asr && du -sh /tmp/ckpt/* || exit 1
  python3 benchmarks/gpu_serving/bench_gpu_serve.py run /tmp/ckpt --out "$OUT" --audio-dir /tmp/q $spy "$@"
  ;;
a)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target $site .devcarry/a/whl/*.whl || exit 1
  cp -r .devcarry/a/stub/* $site/ && cp -r .devcarry/a/q /tmp/q
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import av, aiortc, fastapi, uvicorn, zmq, msgspec, soxr, voxline.realtime.server, \
voxline.engines.factory; print('imports ok')" || exit 1
  python3 benchmarks/gpu_serving/bench_gpu_serve.py build /tmp/ckpt && du -sh /tmp/ckpt/* || exit 1
  [ -n "${SKIP_CHECK:-}" ] || python3 benchmarks/gpu_serving/bench_gpu_serve.py check /tmp/ckpt "$@" 2>&1 | tail -40
  ;;
b)
  carry_b
  # ASR_BENCH=1: first Moonshine batched on the GPU against onnxruntime (bench_gpu_asr.py)
  [ -z "${ASR_BENCH:-}" ] || python3 benchmarks/gpu_speech/bench_gpu_asr.py --audio-dir /tmp/q \
    --out "$OUT/asr_gpu.json" || exit 1
  python3 benchmarks/gpu_serving/bench_gpu_serve.py run /tmp/ckpt --out "$OUT" --audio-dir /tmp/q $(profiler) "$@"
  ;;
s)
  # start-up times (bench_gpu_start.py: cold, warm, engine SIGKILL under load), with phase
  # b's carries, after phase a on the same warm machine
  carry_b
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 benchmarks/gpu_serving/bench_gpu_start.py /tmp/ckpt --out "$OUT/start.json" "$@"
  ;;
esac
# the device returns a bounded number of files: the run's files travel as one archive
if [ -n "${OUT:-}" ] && [ "$phase" != a ] && [ -n "$(ls -A "$OUT")" ]; then
  tar czf /tmp/run.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/run.tgz "$OUT/"
fi
