#!/usr/bin/env bash
# Makes a CPython 3.14 or 3.15 interpreter from Debian's packages (sid), for a
# machine that has none (Debian bookworm ships 3.11), without touching the
# machine's own apt state or its /usr:
#
#     bash scripts/python_debian.sh 3.15    # prints the interpreter's path, last line
#     bash scripts/python_debian.sh 3.14    # (scripts/python314.sh runs this)
#
# Into PREFIX (PYTREE_KIT_PY3XX_PREFIX, for 3.15 PYTREE_KIT_PY315_PREFIX;
# default ~/.cache/pytree_kit/python3.X):
#   - apt-get update/download with a private sources folder naming sid, with the
#     mirror this machine names in /etc/apt/sources.list.d (PREFIX/apt);
#   - dpkg -x of python3.X and the libraries it loads (PREFIX/root);
#   - patchelf: the binary loads the prefix's glibc and libraries, not the
#     machine's (installed with apt-get when missing);
#   - Debian's pyconfig.h includes <x86_64-linux-gnu/python3.X/pyconfig.h>,
#     found under /usr/include on a Debian system: it is rewritten to include
#     the prefix's own, so that an extension builds with no extra flags;
#   - ensurepip (what `-m venv` runs) takes pip's wheel from sysconfig's
#     WHEEL_PKG_DIR, /usr/share/python-wheels, where a Debian machine keeps
#     its own (older) pip: it is pointed at sid's python3-pip-whl in the prefix;
#   - PREFIX/bin/python3.X, a link to the patched binary: `-m venv` makes a
#     virtual environment with pip (which installs from the registry
#     configured for pip).
#
# Then the interpreter is checked: its version, a build with the GIL, the
# standard library's compiled modules (ssl, sqlite3, ctypes, the
# compressors), its headers (pyconfig.h's include rewritten) and pip's wheel
# in the prefix, and `-m venv` making an environment with pip.
# A second run checks the interpreter and exits quickly, changing nothing.
# Needs: bash, apt-get, dpkg, and (once) root for apt-get install patchelf.
set -euo pipefail

#: the versions this script knows the packages of (each has the same list:
#: python3.X's own and the libraries it loads; a new version is added here
#: once its packages are checked against sid's Depends)
SUPPORTED=(3.14 3.15)

usage() {
    echo "usage: bash scripts/python_debian.sh VERSION   (one of: ${SUPPORTED[*]})" >&2
    exit 2
}
(($# == 1)) || usage
V="$1"
known=0
for s in "${SUPPORTED[@]}"; do [[ "$V" == "$s" ]] && known=1; done
((known)) || usage
TAG="${V/./}"                                 # 315
PREFIX_VAR="PYTREE_KIT_PY${TAG}_PREFIX"       # PYTREE_KIT_PY315_PREFIX

PREFIX="${!PREFIX_VAR:-$HOME/.cache/pytree_kit/python$V}"
ROOT="$PREFIX/root"
PY="$PREFIX/bin/python$V"
ARCH_TRIPLET=x86_64-linux-gnu
STAMP="$PREFIX/.complete"

say() { echo "python_debian.sh $V: $*" >&2; }

check() {
    "$PY" -c 'import sys, ssl, sqlite3, ctypes, zlib, lzma, bz2, venv, sysconfig
want = tuple(map(int, sys.argv[2].split(".")))
assert sys.version_info[:2] == want, (sys.version, want)
assert not sysconfig.get_config_var("Py_GIL_DISABLED"), "a free-threaded build"
from pathlib import Path
for path in sysconfig.get_path("include"), sysconfig.get_config_var("WHEEL_PKG_DIR"):
    assert path.startswith(sys.argv[1]), (path, sys.argv[1])
assert (Path(sysconfig.get_path("include")) / "Python.h").is_file()
assert list(Path(sysconfig.get_config_var("WHEEL_PKG_DIR")).glob("pip-*.whl"))' "$ROOT" "$V" \
        >/dev/null 2>&1 &&
        # pyconfig.h includes the prefix's own header, not the machine's
        ! grep -q "include <$ARCH_TRIPLET/python$V/pyconfig.h>" "$ROOT/usr/include/python$V/pyconfig.h"
}

# -m venv makes an environment whose pip runs (ensurepip from the prefix's wheel)
check_venv() {
    local tmp rc=0
    tmp="$(mktemp -d)"
    "$PY" -m venv "$tmp/venv" >/dev/null 2>&1 && "$tmp/venv/bin/python" -m pip --version >/dev/null 2>&1 || rc=1
    rm -rf "$tmp"
    return "$rc"
}

if [[ -f "$STAMP" && -x "$PY" ]] && check; then
    echo "$PY"
    exit 0
fi

if [[ "$(dpkg --print-architecture 2>/dev/null)" != amd64 ]]; then
    say "only amd64 (x86_64) is supported"
    exit 1
fi

# the Debian mirror this machine uses (deb822 .sources or one-line .list)
mirror="$(grep -hE '^(URIs:|deb )' /etc/apt/sources.list.d/*.sources /etc/apt/sources.list.d/*.list \
    /etc/apt/sources.list 2>/dev/null | grep -oE 'https?://[^ ]*/debian/?' | head -n1 || true)"
mirror="${mirror:-http://deb.debian.org/debian}"
keyring=/usr/share/keyrings/debian-archive-keyring.gpg

APT="$PREFIX/apt"
mkdir -p "$APT/parts" "$APT/lists/partial" "$APT/cache/archives/partial" "$APT/debs" "$PREFIX/bin"
{
    echo "Types: deb"
    echo "URIs: ${mirror%/}"
    echo "Suites: sid"
    echo "Components: main"
    [[ -f "$keyring" ]] && echo "Signed-By: $keyring"
} >"$APT/parts/sid.sources"
aptopts=(
    -o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$APT/parts"
    -o "Dir::State::Lists=$APT/lists" -o "Dir::Cache=$APT/cache"
    -o Dir::Etc::Preferences=/dev/null -o Dir::Etc::PreferencesParts=/dev/null
    -o APT::Architecture=amd64 -o Debug::NoLocking=1 -o APT::Sandbox::User=root
)

# python3.X's packages and the libraries its binary and its compiled modules
# load (sid's Depends of python3.X-minimal, libpython3.X-minimal and
# libpython3.X-stdlib); python3-pip-whl for ensurepip
PACKAGES=(
    "python$V" "python$V-minimal" "libpython$V-minimal" "libpython$V-stdlib" "libpython$V"
    "libpython$V-dev" "python$V-dev" "python$V-venv" python3-pip-whl
    libc6 libexpat1 zlib1g libssl3t64 libffi8 libbz2-1.0 liblzma5 libzstd1 libsqlite3-0
    libncursesw6 libtinfo6 libreadline8t64 libmpdec4 libcrypt1 libuuid1 libgcc-s1 libstdc++6
)

# download: the lists are fetched again only when a package is missing
missing=()
for p in "${PACKAGES[@]}"; do
    compgen -G "$APT/debs/${p}_*.deb" >/dev/null || missing+=("$p")
done
if ((${#missing[@]})); then
    say "apt-get update (sid, $mirror)"
    apt-get "${aptopts[@]}" -qq update >&2
    say "downloading ${#missing[@]} packages"
    (cd "$APT/debs" && apt-get "${aptopts[@]}" -qq download "${missing[@]}" >&2)
fi

say "unpacking into $ROOT"
rm -rf "$ROOT"
mkdir -p "$ROOT"
for p in "${PACKAGES[@]}"; do
    deb=$(compgen -G "$APT/debs/${p}_*.deb" | sort -V | tail -n1)
    dpkg -x "$deb" "$ROOT"
done

if ! command -v patchelf >/dev/null; then
    if [[ "$(id -u)" == 0 ]]; then
        say "apt-get install patchelf"
        DEBIAN_FRONTEND=noninteractive apt-get -qq install -y patchelf >&2 \
            || { apt-get -qq update >&2 && DEBIAN_FRONTEND=noninteractive apt-get -qq install -y patchelf >&2; }
    else
        say "patchelf is missing (apt-get install patchelf, as root)"
        exit 1
    fi
fi

# the loader: usr/lib64 (merged /usr) or lib64
loader="$ROOT/usr/lib64/ld-linux-x86-64.so.2"
[[ -e "$loader" ]] || loader="$ROOT/lib64/ld-linux-x86-64.so.2"
libs="$ROOT/lib/$ARCH_TRIPLET:$ROOT/usr/lib/$ARCH_TRIPLET"
bin="$ROOT/usr/bin/python$V"
patchelf --set-interpreter "$loader" --force-rpath --set-rpath "$libs" "$bin"

# Debian's pyconfig.h includes <x86_64-linux-gnu/python3.X/pyconfig.h>, which a
# compiler finds under the machine's /usr/include, not the prefix's: include
# the prefix's own by a path relative to the header
inc="$ROOT/usr/include/python$V"
if grep -q "include <$ARCH_TRIPLET/python$V/pyconfig.h>" "$inc/pyconfig.h"; then
    sed -i "s|include <$ARCH_TRIPLET/python$V/pyconfig.h>|include \"../$ARCH_TRIPLET/python$V/pyconfig.h\"|" \
        "$inc/pyconfig.h"
fi

# ensurepip (-m venv) installs pip from WHEEL_PKG_DIR, /usr/share/python-wheels:
# the machine's pip there (if any) is not for this Python; use sid's, in the prefix
for data in "$ROOT"/usr/lib/python"$V"/_sysconfigdata_*.py; do
    sed -i "s|'WHEEL_PKG_DIR': '/usr/share/python-wheels/'|'WHEEL_PKG_DIR': '$ROOT/usr/share/python-wheels/'|" "$data"
done

ln -sfn "$bin" "$PY"
ln -sfn "python$V" "$PREFIX/bin/python3"

# sysconfig's prefix comes from the binary's real path: a venv made from the link
# still reads the headers under ROOT/usr/include (check asserts it)
if ! check || ! check_venv; then
    say "the interpreter does not work:"
    "$PY" -c 'import sys, sysconfig; print(sys.version); print(sysconfig.get_path("include"))' >&2 || true
    "$PY" -c 'import ssl, sqlite3, ctypes, zlib, lzma, bz2, venv' >&2 || true
    exit 1
fi
touch "$STAMP"
say "$("$PY" -c 'import sys; print(sys.version.split()[0])') ready"
echo "$PY"
