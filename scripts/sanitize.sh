#!/usr/bin/env bash
# Runs the test suite against an AddressSanitizer + UndefinedBehaviorSanitizer
# build of the C engine (pytree_kit/_speedups.c and the parts it includes; _core.h has their map).
#
# The repository's files (git ls-files -co --exclude-standard: no built .so, no
# .venv) are copied to a fresh temporary directory, the extension is built there
# in place with -fsanitize=address,undefined, and pytest runs in that copy with
# the sanitizer runtimes preloaded into the (uninstrumented) Python interpreter.
# The checkout itself is never touched. The script checks that the .so really is
# instrumented and, from inside the pytest process, that pytree_kit._speedups is
# the copy's sanitized .so, with ASan live in the process.
#
# Only our extension is compiled with the sanitizers; ASan's malloc/free and
# libc interceptors are still global, so a third-party extension (torch, jaxlib,
# ...) can trip them. scripts/asan.supp, when present, suppresses such reports by
# third-party library only (it must never name pytree_kit); none is checked in,
# as no third-party report has come up (torch, jax, optree and dm-tree included).
# UBSan needs none: only our .so carries UBSan checks.
set -euo pipefail

usage() {
    cat <<'EOF'
usage: scripts/sanitize.sh [--quick] [--] [extra pytest args...]

Builds pytree_kit._speedups with -fsanitize=address,undefined in a temporary
copy of the repository and runs the test suite there (C engine active).

  --quick     run a fast subset (engines, kinds, errors, depth, laws, fast calls)
              instead of the whole suite (tests/ and the doctests, less
              tests/test_lint.py)
  -h, --help  print this help
  --          pass everything after it to pytest unchanged

Any other argument is passed to pytest. The interpreter is $PYTHON if set, else
.venv/bin/python in the repository root if present, else python3; it needs
pytree_kit's test dependencies (pip install -e '.[test]').
Exits nonzero if the build, the checks, pytest or a sanitizer fails.
EOF
}

quick=0
pytest_args=()
while [ $# -gt 0 ]; do
    case "$1" in
    --quick) quick=1 ;;
    -h | --help)
        usage
        exit 0
        ;;
    --)
        shift
        pytest_args+=("$@")
        break
        ;;
    *) pytest_args+=("$1") ;;
    esac
    shift
done

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [ -n "${PYTHON:-}" ]; then
    python=$PYTHON
elif [ -x "$root/.venv/bin/python" ]; then
    python=$root/.venv/bin/python
else
    python=python3
fi
case $python in # the build and the run happen in a copy, elsewhere
/*) ;;
*/*) python=$PWD/$python ;;
esac
command -v "$python" >/dev/null || {
    echo "sanitize: no Python interpreter: $python" >&2
    exit 1
}

now() { echo "${EPOCHREALTIME:-$(date +%s)}"; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
die() {
    echo "sanitize: FAILED: $*" >&2
    exit 1
}

t_start=$(now)
work=$(mktemp -d "${TMPDIR:-/tmp}/pytree_kit-sanitize.XXXXXX")
trap 'rm -rf "$work"' EXIT
src=$work/src
logs=$work/logs
plugin=$work/plugin
mkdir -p "$src" "$logs" "$plugin"

echo "sanitize: python $("$python" -c 'import sys; print(sys.version.split()[0])') ($python)"
echo "sanitize: copying $root to $src"
git -C "$root" rev-parse --is-inside-work-tree >/dev/null ||
    die "$root is not a git checkout"
# Tracked files deleted in the working tree are still listed by ls-files -c.
git -C "$root" ls-files -z -co --exclude-standard |
    while IFS= read -r -d '' f; do
        if [ -e "$root/$f" ] || [ -L "$root/$f" ]; then printf '%s\0' "$f"; fi
    done |
    tar -C "$root" --null -T - -cf - | tar -C "$src" -xf -
if find "$src" -name '*.so' | grep -q .; then
    die "the copy already holds a built extension: $(find "$src" -name '*.so')"
fi

# -- build --------------------------------------------------------------------------
cflags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -O1 -g"
ldflags="-fsanitize=address,undefined"
echo "sanitize: building the extension (PYTREE_KIT_CFLAGS=\"$cflags\")"
t_build=$(now)
if ! (cd "$src" && PYTREE_KIT_REQUIRE_C=1 PYTREE_KIT_CFLAGS="$cflags" PYTREE_KIT_LDFLAGS="$ldflags" \
    "$python" setup.py build_ext --inplace) >"$logs/build.log" 2>&1; then
    cat "$logs/build.log" >&2
    die "the build failed"
fi
build_s=$(since "$t_build")
grep -E '(^| )-fsanitize=address' "$logs/build.log" | sed 's/^/sanitize:   /' || true

shopt -s nullglob
sos=("$src"/pytree_kit/_speedups*.so)
shopt -u nullglob
[ ${#sos[@]} -eq 1 ] || die "expected one pytree_kit/_speedups*.so in the copy, found ${#sos[@]}"
so=$(realpath "${sos[0]}")

# -- is it really sanitized? --------------------------------------------------------
undefined_syms=$(nm -D --undefined-only "$so" | awk '{ print $NF }')
grep -qx '__asan_init' <<<"$undefined_syms" || die "$so does not reference __asan_init"
grep -q '^__asan_report_' <<<"$undefined_syms" || die "$so has no ASan checks (__asan_report_*)"
grep -q '^__ubsan_handle_' <<<"$undefined_syms" || die "$so has no UBSan checks (__ubsan_handle_*)"
echo "sanitize: $so references __asan_init," \
    "$(grep -c '^__asan_report_' <<<"$undefined_syms") __asan_report_* and" \
    "$(grep -c '^__ubsan_handle_' <<<"$undefined_syms") __ubsan_handle_* symbols"

# The runtimes to preload: those the .so is linked against (gcc links them
# dynamically), else the compiler's.
runtime() { # runtime NAME -> path of libNAME.so
    local path
    path=$(ldd "$so" | awk -v n="lib$1.so" 'index($1, n) == 1 && $3 ~ /^\// { print $3; exit }')
    if [ -z "$path" ]; then
        path=$("${CC:-gcc}" -print-file-name="lib$1.so")
    fi
    [ -f "$path" ] || die "no lib$1.so runtime found (got '$path')"
    realpath "$path"
}
preload="$(runtime asan) $(runtime ubsan)"
echo "sanitize: LD_PRELOAD=$preload"

# -- pytest plugin: checks from inside the run, and records the current test ---------
cat >"$plugin/_pytree_kit_sanitize.py" <<'EOF'
"""Loaded by scripts/sanitize.sh with -p: the run must use the sanitized C engine."""

from __future__ import annotations

import ctypes
import glob
import os

import pytest

_LOGS = os.environ["PYTREE_KIT_SANITIZE_LOGS"]
_CURRENT = os.path.join(_LOGS, "current-test")
_seen: set[str] = set()


def _check() -> str:
    import pytree_kit
    from pytree_kit import _speedups

    want = os.environ["PYTREE_KIT_SANITIZE_SO"]
    got = os.path.realpath(_speedups.__file__)
    problems = []
    if got != want:
        problems.append(f"pytree_kit._speedups is {got}, not the sanitized {want}")
    if pytree_kit.ENGINE != "c":
        problems.append(f"pytree_kit.ENGINE is {pytree_kit.ENGINE!r}, not 'c'")
    src = os.environ["PYTREE_KIT_SANITIZE_SRC"]
    if not os.path.realpath(pytree_kit.__file__).startswith(src + os.sep):
        problems.append(f"pytree_kit is imported from {pytree_kit.__file__}, not from {src}")
    try:
        getattr(ctypes.CDLL(None), "__asan_init")
    except AttributeError:
        problems.append("the ASan runtime is not loaded in this process")
    if problems:
        raise pytest.UsageError("sanitize: " + "; ".join(problems))
    return got


def pytest_configure(config: pytest.Config) -> None:
    config._pytree_kit_sanitize_so = _check()  # type: ignore[attr-defined]


def pytest_report_header(config: pytest.Config) -> str:
    return f"sanitize: C engine {config._pytree_kit_sanitize_so} (ASan + UBSan)"  # type: ignore[attr-defined]


def pytest_runtest_logstart(nodeid: str, location: object) -> None:
    # A sanitizer report kills the process without a word from pytest: the
    # script reads this file to say which test was running.
    with open(_CURRENT, "w") as f:
        f.write(nodeid + "\n")


def pytest_runtest_logfinish(nodeid: str, location: object) -> None:
    # Reports written meanwhile (by subprocesses the test ran) name this test.
    new = set(glob.glob(os.path.join(_LOGS, "*san.*"))) - _seen
    _seen.update(new)
    with open(os.path.join(_LOGS, "report-tests"), "a") as f:
        f.writelines(f"{os.path.basename(r)} {nodeid}\n" for r in sorted(new))


def pytest_sessionfinish(session: pytest.Session) -> None:
    with open(_CURRENT, "w") as f:
        f.write("(none: the session finished)\n")
EOF

# -- run ------------------------------------------------------------------------------
asan_options="detect_leaks=0:halt_on_error=1:abort_on_error=0:log_path=$logs/asan"
if [ -f "$root/scripts/asan.supp" ]; then
    cp "$root/scripts/asan.supp" "$work/asan.supp"
    asan_options="$asan_options:suppressions=$work/asan.supp"
fi
ubsan_options="print_stacktrace=1:halt_on_error=1:log_path=$logs/ubsan"

if [ "$quick" = 1 ]; then
    # test_depth's million-level runs go through the public functions, with
    # most of their time in Python (building the chains, comparing, repr):
    # ~150 s of a 550 s run on 3.10. The C engine's million levels are run
    # here by test_engines.py's test_depth_a_million, and test_depth.py's
    # 100,000-level runs of every kind stay.
    selection=(tests/test_engines.py tests/test_kinds.py tests/test_errors.py tests/test_depth.py
        tests/test_api.py tests/test_fastcall.py tests/test_reach.py tests/test_iter.py
        tests/test_rows.py -k "not test_million")
else
    # The repository's testpaths: tests/ and the doctests in pytree_kit/, less
    # tests/test_lint.py: ruff (a Rust binary) and mypy (a subprocess that never
    # imports pytree_kit._speedups) run no C engine code, so ASan has nothing to
    # check there; under the preloaded runtime mypy alone takes ~2 minutes, and
    # lint is judged by the ordinary test run.
    selection=(--ignore=tests/test_lint.py)
fi
cmd=("$python" -m pytest -p _pytree_kit_sanitize
    ${selection[@]+"${selection[@]}"} ${pytest_args[@]+"${pytest_args[@]}"})
echo "sanitize: ASAN_OPTIONS=$asan_options"
echo "sanitize: UBSAN_OPTIONS=$ubsan_options"
echo "sanitize: (cd $src && ${cmd[*]})"

t_tests=$(now)
set +e
(
    cd "$src"
    unset PYTREE_KIT_PURE
    export PYTHONPATH="$src:$plugin" PYTHONMALLOC=malloc PYTHONDONTWRITEBYTECODE=1 \
        PYTREE_KIT_SANITIZE_SO="$so" PYTREE_KIT_SANITIZE_SRC="$(realpath "$src")" \
        PYTREE_KIT_SANITIZE_LOGS="$logs" \
        ASAN_OPTIONS="$asan_options" UBSAN_OPTIONS="$ubsan_options"
    LD_PRELOAD="$preload" "${cmd[@]}"
) 2>&1 | tee "$logs/pytest.log"
status=${PIPESTATUS[0]}
set -e
tests_s=$(since "$t_tests")

# -- report ---------------------------------------------------------------------------
shopt -s nullglob
reports=("$logs"/asan.* "$logs"/ubsan.*)
shopt -u nullglob
summary=$(grep -E '^(=+ )?[0-9a-z, ]*(passed|failed|errors?|skipped|no tests ran)[0-9a-z, ]* in [0-9.]+s' \
    "$logs/pytest.log" | tail -n 1 | sed -E 's/^=+ //; s/ =+$//' || true)

# A test may crash a child process on purpose with faulthandler._sigsegv()
# (tests/test_fuzz_json.py checks that scripts/fuzz_json.py reports a crashed
# child and goes on). ASan catches that SIGSEGV and writes a report like any
# other; such a report is set aside, and shown, only when its SUMMARY is a SEGV,
# its stack has faulthandler_sigsegv (reached from Python code only, never from
# a crash in C) and it does not mention _speedups.
deliberate_crash() {
    grep -q '^SUMMARY: AddressSanitizer: SEGV' "$1" &&
        grep -qE '^ +#[0-9]+ 0x[0-9a-f]+ in faulthandler_sigsegv ' "$1" &&
        ! grep -q '_speedups' "$1"
}
test_of() { # test_of REPORT -> the test that was running when REPORT was written
    local t
    t=$(awk -v r="$(basename "$1")" '$1 == r { print $2; exit }' "$logs/report-tests" 2>/dev/null || true)
    if [ -z "$t" ] && [ -f "$logs/current-test" ]; then t=$(cat "$logs/current-test"); fi
    echo "${t:-(unknown)}"
}

echo
echo "sanitize: -------------------------------------------------------------------"
findings=0
ignored=0
for r in ${reports[@]+"${reports[@]}"}; do
    if deliberate_crash "$r"; then
        ignored=$((ignored + 1))
        echo "sanitize: set aside: $r, a deliberate faulthandler._sigsegv() crash in $(test_of "$r"):"
        grep -E '^SUMMARY|in faulthandler_sigsegv ' "$r" | sed 's/^/sanitize:   /'
        continue
    fi
    findings=$((findings + 1))
    echo "sanitize: sanitizer report $r, written during $(test_of "$r"):"
    cat "$r"
    if grep -q '_speedups' "$r"; then
        echo "sanitize: ^^^ this report goes through pytree_kit._speedups: a bug in the C engine"
    fi
done
echo "sanitize: mode:      $([ "$quick" = 1 ] && echo quick || echo "whole suite")$(
    [ ${#pytest_args[@]} = 0 ] || echo " selection, extra pytest args: ${pytest_args[*]}")"
echo "sanitize: build:     ${build_s} s"
echo "sanitize: pytest:    ${tests_s} s, exit status $status"
echo "sanitize: summary:   ${summary:-(no pytest summary: the process died, see above)}"
echo "sanitize: reports:   $findings sanitizer report(s)$([ "$ignored" = 0 ] || echo ", $ignored deliberate crash(es) set aside")"
echo "sanitize: total:     $(since "$t_start") s"
if [ "$status" -ne 0 ] || [ "$findings" -gt 0 ]; then
    echo "sanitize: FAILED" >&2
    exit 1
fi
echo "sanitize: OK"
