#!/usr/bin/env bash
# The checks that need a CUDA device, in one run (for a session lent a GPU
# machine; CI has none, and there every one of these skips cleanly).
#
#     OUT=benchmarks/results/gpu bash scripts/gpu_checks.sh
#
# Writes into $OUT: env.txt (the machine, Python, torch, CUDA), pinning.md
# (benchmarks/pinning.py, full), distributed_nccl.md (benchmarks/distributed.py
# on NCCL, one rank, --quick) and tests.log (the torch suites, with CUDA, so the
# GPU tests run and the CPU-only ones skip). The C engine is built in place
# first; if it does not build, the pure engine runs and env.txt says so.
set -uo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?set OUT to the folder the results go in}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # the scripts under benchmarks/ import the package
PY=${PYTHON:-python3}
status=0

{
    date -u
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    "$PY" -c "import sys, torch; print('Python', sys.version.split()[0], '| torch', torch.__version__, '| CUDA', torch.version.cuda, '|', torch.cuda.get_device_name())"
} >"$OUT/env.txt" 2>&1

if PYTREE_KIT_REQUIRE_C=1 "$PY" setup.py -q build_ext --inplace >"$OUT/build.log" 2>&1; then
    "$PY" -c "import pytree_kit as pk; print('engine:', pk.ENGINE)" >>"$OUT/env.txt" 2>&1
else
    echo "engine: pure (the C engine did not build: build.log)" >>"$OUT/env.txt"
fi
cat "$OUT/env.txt"

"$PY" benchmarks/pinning.py --out "$OUT" || status=1
"$PY" benchmarks/distributed.py --backend nccl --world 1 --quick --out "$OUT" || status=1
if [ -f "$OUT/distributed.md" ]; then
    mv "$OUT/distributed.md" "$OUT/distributed_nccl.md"
fi

"$PY" -m pytest -p no:cacheprovider -q -rs -o addopts="" --timeout 300 \
    tests/torch/test_collate.py tests/torch/test_loading.py tests/torch/test_distributed.py \
    "tests/test_benchmark_smoke.py::test_pinning_benchmark_smoke" \
    >"$OUT/tests.log" 2>&1 || status=1
tail -n 25 "$OUT/tests.log"
exit $status
