#!/usr/bin/env bash
# One device call for issue 24's prologue projections (H200): GPU tests, bench_gpu_tts A/B
# (prologue off vs on, attention kernel on in both), then the op/frame/kernel-count check.
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_prologue_gemv.py -x 2>&1 | tee $OUT/pytest.log | tail -25 || { echo "PYTEST FAILED: benches skipped"; exit 3; }
timeout 270 python3 benchmarks/bench_gpu_tts.py --modes compiled --qkv-attention on --prologue-gemv ab \
  --buckets 1,4 --concurrency 1,4 --max-len 128 --no-twin --out $OUT/ab.json 2>&1 | tee $OUT/ab.log | grep -v "^W\|Warning" | tail -30
timeout ${REST:-140} python3 benchmarks/bench_prologue_gemv.py --batches 1,4 --frames 4 --out $OUT/check.json 2>&1 \
  | tee $OUT/check.log | grep -v "^W\|Warning" | tail -20
ls -la $OUT
