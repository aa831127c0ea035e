#!/usr/bin/env bash
# The checks that need a CUDA device, in one run (for a session lent a GPU
# machine; CI has none, and there every one of these skips cleanly).
#
#     OUT=benchmarks/results/gpu bash scripts/gpu_checks.sh
#     OUT=... CHECKS="transfer pipeline tests" bash scripts/gpu_checks.sh
#
# Writes into $OUT: env.txt (the machine, Python, torch, CUDA), and for each
# of $CHECKS (all by default):
# - pinning: pinning.md (benchmarks/pinning.py, full);
# - distributed: distributed_nccl.md (benchmarks/distributed.py on NCCL, one
#   rank, --quick);
# - transfer: transfer_peers.md (benchmarks/transfer_peers.py --thresholds
#   --bound: against accelerate, Lightning and tree_map, COALESCE_MIN's,
#   STAGE_LIMIT's and PINNED_OWN's measurement, and what a blocking call of a
#   few tensors can reach);
# - pipeline: pipeline.md (benchmarks/pipeline.py: the whole input pipeline
#   against torch's own, four workers);
# - tests: tests.log (the torch suites, with CUDA, so the GPU tests run and the
#   CPU-only ones skip).
# The C engine is built in place first; if it does not build, the pure engine
# runs and env.txt says so. Each check has a time limit (a lease is short).
set -uo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?set OUT to the folder the results go in}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # the scripts under benchmarks/ import the package
PY=${PYTHON:-python3}
CHECKS=${CHECKS:-pinning distributed transfer pipeline tests}
status=0
wants() { [[ " $CHECKS " == *" $1 "* ]]; }

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

if wants pinning; then
    timeout 300 "$PY" benchmarks/pinning.py --out "$OUT" || status=1
fi
if wants distributed; then
    timeout 300 "$PY" benchmarks/distributed.py --backend nccl --world 1 --quick --out "$OUT" || status=1
    if [ -f "$OUT/distributed.md" ]; then
        mv "$OUT/distributed.md" "$OUT/distributed_nccl.md"
    fi
fi
if wants transfer; then
    timeout 200 "$PY" benchmarks/transfer_peers.py --thresholds --bound --out "$OUT" >"$OUT/transfer.log" 2>&1 || status=1
    tail -n 45 "$OUT/transfer.log"
fi
if wants pipeline; then
    timeout 260 "$PY" benchmarks/pipeline.py --out "$OUT" >"$OUT/pipeline.log" 2>&1 || status=1
    tail -n 50 "$OUT/pipeline.log"
fi
if wants tests; then
    timeout 400 "$PY" -m pytest -p no:cacheprovider -q -rs -o addopts="" --timeout 120 \
        tests/torch/test_transfer.py tests/torch/test_collate.py tests/torch/test_loading.py \
        tests/torch/test_distributed.py "tests/test_benchmark_smoke.py::test_pinning_benchmark_smoke" \
        >"$OUT/tests.log" 2>&1 || status=1
    tail -n 25 "$OUT/tests.log"
fi
exit $status
