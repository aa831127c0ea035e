#!/usr/bin/env bash
# Makes a free-threaded CPython 3.13 ("3.13t": built with --disable-gil) from
# Debian trixie's python3.13 source package, for a machine that has none
# (Debian serves no free-threaded binary of 3.13), without touching the
# machine's own apt state or its /usr:
#
#     bash scripts/python313t.sh           # prints the interpreter's path, last line
#     bash scripts/python313t.sh --tsan    # also a ThreadSanitizer build (its path last)
#
# Into PREFIX (PYTREE_KIT_PY313T_PREFIX, default ~/.cache/pytree_kit/python3.13t),
# with --tsan also into PYTREE_KIT_PY313T_TSAN_PREFIX (default
# ~/.cache/pytree_kit/python3.13t-tsan):
#   - apt-get update/source --download-only with a private sources folder
#     naming trixie's deb-src, with the mirror this machine names in
#     /etc/apt/sources.list.d (PYTREE_KIT_PY313_SOURCE, default
#     ~/.cache/pytree_kit/python3.13-source: the .dsc, verified against the
#     signed Sources index by apt, and the upstream .orig tarball);
#   - the upstream tarball unpacked (Debian's patches are not applied: they
#     are for Debian's multiarch layout), then
#     `./configure --disable-gil --prefix=PREFIX` (no PGO, no LTO: about 10
#     minutes on 2 cores), `make -jJOBS` (PYTREE_KIT_JOBS, default the cores,
#     at most 2), `make install`; the build folder is removed afterwards;
#   - --tsan: the same with --with-thread-sanitizer, and CPython's own
#     suppressions for a free-threaded build copied to
#     PREFIX/share/tsan-suppressions.txt (use
#     TSAN_OPTIONS=suppressions=<that file>).
#
# Then the interpreter is checked: its version, Py_GIL_DISABLED = 1 and
# sys._is_gil_enabled() False by default, the standard library's compiled
# modules (ssl, zlib, ctypes, sqlite3, the compressors), its headers, and
# `-m venv` making an environment whose pip runs. A second run checks the
# interpreter and exits quickly, changing nothing.
# Needs: bash, apt-get, dpkg-source, gcc, make, and the -dev packages of
# openssl, zlib, libffi, bzip2, xz, sqlite3, readline, ncurses, uuid
# (build-essential's machine has them; a missing one makes check fail, naming
# the module).
set -euo pipefail

V=3.13
TSAN=0
for arg in "$@"; do
    case "$arg" in
    --tsan) TSAN=1 ;;
    *)
        echo "usage: bash scripts/python313t.sh [--tsan]" >&2
        exit 2
        ;;
    esac
done

PREFIX="${PYTREE_KIT_PY313T_PREFIX:-$HOME/.cache/pytree_kit/python${V}t}"
TSAN_PREFIX="${PYTREE_KIT_PY313T_TSAN_PREFIX:-$HOME/.cache/pytree_kit/python${V}t-tsan}"
SOURCE="${PYTREE_KIT_PY313_SOURCE:-$HOME/.cache/pytree_kit/python$V-source}"
cores="$(nproc 2>/dev/null || echo 2)"
JOBS="${PYTREE_KIT_JOBS:-$((cores < 2 ? cores : 2))}"

say() { echo "python313t.sh: $*" >&2; }

# check PREFIX [tsan]: the free-threaded interpreter works
check() {
    local py="$1/bin/python${V}t"
    [[ -x "$py" ]] || return 1
    env -u PYTHON_GIL "$py" -c 'import sys, ssl, zlib, ctypes, sqlite3, lzma, bz2, venv, sysconfig
from pathlib import Path
want = tuple(map(int, sys.argv[2].split(".")))
assert sys.version_info[:2] == want, (sys.version, want)
assert sysconfig.get_config_var("Py_GIL_DISABLED") == 1, "not a free-threaded build"
assert not sys._is_gil_enabled(), "the GIL is on by default"
assert sys.prefix == sys.argv[1], (sys.prefix, sys.argv[1])
assert (Path(sysconfig.get_path("include")) / "Python.h").is_file()
if sys.argv[3] == "1":
    assert "-fsanitize=thread" in sysconfig.get_config_var("CONFIG_ARGS") + sysconfig.get_config_var("CFLAGS"), "no TSAN"' \
        "$1" "$V" "${2:-0}"
}

# -m venv makes an environment whose pip runs (ensurepip)
check_venv() {
    local tmp rc=0
    tmp="$(mktemp -d)"
    "$1/bin/python${V}t" -m venv "$tmp/venv" >/dev/null &&
        "$tmp/venv/bin/python" -m pip --version >/dev/null || rc=1
    rm -rf "$tmp"
    return "$rc"
}

ready() { [[ -f "$1/.complete" ]] && check "$1" "$2" >/dev/null 2>&1; }

# the source: trixie's python3.13 (.dsc and upstream tarball), once
fetch_source() {
    if compgen -G "$SOURCE/python${V}_*.orig.tar.xz" >/dev/null &&
        compgen -G "$SOURCE/python${V}_*.dsc" >/dev/null; then
        return 0
    fi
    local mirror keyring=/usr/share/keyrings/debian-archive-keyring.gpg
    mirror="$(grep -hE '^(URIs:|deb )' /etc/apt/sources.list.d/*.sources /etc/apt/sources.list.d/*.list \
        /etc/apt/sources.list 2>/dev/null | grep -oE 'https?://[^ ]*/debian/?' | head -n1 || true)"
    mirror="${mirror:-http://deb.debian.org/debian}"
    local apt="$SOURCE/apt"
    mkdir -p "$apt/parts" "$apt/lists/partial" "$apt/cache/archives/partial"
    {
        echo "Types: deb-src"
        echo "URIs: ${mirror%/}"
        echo "Suites: trixie"
        echo "Components: main"
        [[ -f "$keyring" ]] && echo "Signed-By: $keyring"
    } >"$apt/parts/trixie-src.sources"
    local aptopts=(
        -o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$apt/parts"
        -o "Dir::State::Lists=$apt/lists" -o "Dir::Cache=$apt/cache"
        -o Dir::Etc::Preferences=/dev/null -o Dir::Etc::PreferencesParts=/dev/null
        -o Debug::NoLocking=1 -o APT::Sandbox::User=root
    )
    say "apt-get update (trixie deb-src, $mirror)"
    apt-get "${aptopts[@]}" -qq update >&2
    say "apt-get source --download-only python$V"
    (cd "$SOURCE" && apt-get "${aptopts[@]}" -qq source --download-only "python$V" >&2)
}

# build PREFIX [configure options...]
build() {
    local prefix="$1"
    shift
    local orig work
    orig="$(compgen -G "$SOURCE/python${V}_*.orig.tar.xz" | sort -V | tail -n1)"
    work="$prefix.build"
    rm -rf "$work" "$prefix"
    mkdir -p "$work"
    say "unpacking $(basename "$orig") into $work"
    tar -xJf "$orig" -C "$work" --strip-components=1
    local started=$SECONDS
    say "configure --disable-gil $* --prefix=$prefix"
    (cd "$work" && ./configure --disable-gil "$@" --prefix="$prefix" --with-ensurepip=install \
        >"$work/configure.log" 2>&1) || {
        tail -n 30 "$work/configure.log" >&2
        return 1
    }
    say "make -j$JOBS (log: $work/make.log)"
    (cd "$work" && make -j"$JOBS" >"$work/make.log" 2>&1 && make install >"$work/install.log" 2>&1) || {
        tail -n 40 "$work/make.log" "$work/install.log" 2>/dev/null >&2
        return 1
    }
    if [[ " $* " == *" --with-thread-sanitizer "* ]]; then
        mkdir -p "$prefix/share"
        cp "$work/Tools/tsan/suppressions_free_threading.txt" "$prefix/share/tsan-suppressions.txt"
    fi
    rm -rf "$work"
    say "built in $(((SECONDS - started) / 60)) min $(((SECONDS - started) % 60)) s"
}

# make PREFIX TSAN(0|1) [configure options...]
make_one() {
    local prefix="$1" tsan="$2"
    shift 2
    if ready "$prefix" "$tsan"; then
        return 0
    fi
    fetch_source
    build "$prefix" "$@"
    # the TSAN build's own interpreter reports races of CPython 3.13 itself:
    # its checks run with CPython's suppressions, reports not fatal
    local opts=""
    [[ "$tsan" == 1 ]] && opts="suppressions=$prefix/share/tsan-suppressions.txt:halt_on_error=0:report_signal_unsafe=0"
    if ! TSAN_OPTIONS="$opts" check "$prefix" "$tsan" || ! TSAN_OPTIONS="$opts" check_venv "$prefix"; then
        say "the interpreter in $prefix does not work"
        return 1
    fi
    touch "$prefix/.complete"
    say "$("$prefix/bin/python${V}t" -c 'import sys; print(sys.version.split()[0])' 2>/dev/null) ready in $prefix"
}

make_one "$PREFIX" 0
((TSAN)) && make_one "$TSAN_PREFIX" 1 --with-thread-sanitizer
echo "$PREFIX/bin/python${V}t"
((TSAN)) && echo "$TSAN_PREFIX/bin/python${V}t"
exit 0
