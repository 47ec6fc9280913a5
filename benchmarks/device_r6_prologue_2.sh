#!/usr/bin/env bash
# Second device call for issue 24 (H200): the SwiGLU-prologue-only default and the
# unrolled loop; layer tests, frame-step arms (off / swiglu / all), bench_gpu_tts A/B at c=1.
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
timeout 35 python3 -m pytest -q -p no:cacheprovider tests/test_prologue_gemv.py -x -k "layer or swiglu_kernel" 2>&1 \
  | tee $OUT/pytest2.log | tail -4
timeout 85 python3 benchmarks/bench_prologue_gemv.py --batches 1 --frames 3 --no-op --out $OUT/check2.json 2>&1 \
  | tee $OUT/check2.log | grep -v "^W\|Warning\|^frames\|^timing" | tail -8
timeout 90 python3 benchmarks/bench_gpu_tts.py --modes compiled --qkv-attention on --prologue-gemv ab \
  --buckets 1 --concurrency 1 --max-len 128 --no-twin --out $OUT/ab2.json 2>&1 | tee $OUT/ab2.log | grep -v "^W\|Warning\|cuda_graphs" | tail -8
