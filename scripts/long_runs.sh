#!/usr/bin/env bash
# The long reliability runs (docs/reliability.md). CI runs a fast subset of
# each as part of the test suite; these are the full-size runs, about an hour
# and a half on 2 cores. Run from anywhere:
#
#     scripts/long_runs.sh            # everything
#     scripts/long_runs.sh fuzz depth # some of: sanitize fuzz json leaks depth threads hypothesis
#
# The interpreter is $PYTHON if set, else .venv/bin/python, else python3, with
# the test extra installed and the C engine built (pip install -e '.[test]').
# Each run prints its own summary; the script stops at the first failure.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
if [ -n "${PYTHON:-}" ]; then
    python=$PYTHON
elif [ -x .venv/bin/python ]; then
    python=.venv/bin/python
else
    python=python3
fi
export PYTHON=$python

runs=("$@")
[ ${#runs[@]} -gt 0 ] || runs=(sanitize fuzz json leaks depth threads hypothesis)

both_engines() { # run a pytest command once per engine
    "$python" -m pytest -q -p no:cacheprovider "$@"
    PYTREE_KIT_PURE=1 "$python" -m pytest -q -p no:cacheprovider "$@"
}

for run in "${runs[@]}"; do
    echo "== long run: $run"
    start=$(date +%s)
    case "$run" in
    sanitize) scripts/sanitize.sh ;;                               # the whole suite, ASan+UBSan
    fuzz) "$python" scripts/fuzz_engines.py --cases 100000 --seed 1000000 ;;
    json) "$python" scripts/fuzz_json.py --docs 10000 ;;
    leaks) "$python" scripts/leaks.py --calls 1000000 --engine both ;;
    depth) PYTREE_KIT_TEST_DEPTH=1000000 both_engines --timeout 3600 tests/test_depth.py ;;
    threads) PYTREE_KIT_THREAD_ROUNDS=3000 both_engines --timeout 3600 tests/test_threads.py ;;
    hypothesis) HYPOTHESIS_PROFILE=long "$python" -m pytest -q -p no:cacheprovider tests/test_engines.py ;;
    *)
        echo "long_runs: unknown run '$run'" >&2
        exit 2
        ;;
    esac
    echo "== $run: passed in $(($(date +%s) - start)) s"
done
