#!/usr/bin/env bash
# Makes a CPython 3.14 interpreter from Debian's packages (sid), for a machine
# that has none (Debian bookworm ships 3.11), without touching the machine's
# own apt state or its /usr:
#
#     bash scripts/python314.sh        # prints the interpreter's path, last line
#
# Into PREFIX (PYTREE_KIT_PY314_PREFIX, default ~/.cache/pytree_kit/python3.14):
#   - apt-get update/download with a private sources folder naming sid, with the
#     mirror this machine names in /etc/apt/sources.list.d (PREFIX/apt);
#   - dpkg -x of python3.14 and the libraries it loads (PREFIX/root);
#   - patchelf: the binary loads the prefix's glibc and libraries, not the
#     machine's (installed with apt-get when missing);
#   - Debian's pyconfig.h includes <x86_64-linux-gnu/python3.14/pyconfig.h>,
#     found under /usr/include on a Debian system: it is rewritten to include
#     the prefix's own, so that an extension builds with no extra flags;
#   - ensurepip (what `-m venv` runs) takes pip's wheel from sysconfig's
#     WHEEL_PKG_DIR, /usr/share/python-wheels, where a Debian machine keeps
#     its own (older) pip: it is pointed at sid's python3-pip-whl in the prefix;
#   - PREFIX/bin/python3.14, a link to the patched binary: `-m venv` makes a
#     virtual environment with pip (which installs from the registry
#     configured for pip).
#
# A second run checks the interpreter and exits quickly, changing nothing.
# Needs: bash, apt-get, dpkg, and (once) root for apt-get install patchelf.
set -euo pipefail

PREFIX="${PYTREE_KIT_PY314_PREFIX:-$HOME/.cache/pytree_kit/python3.14}"
ROOT="$PREFIX/root"
PY="$PREFIX/bin/python3.14"
ARCH_TRIPLET=x86_64-linux-gnu
STAMP="$PREFIX/.complete"

say() { echo "python314.sh: $*" >&2; }

check() {
    "$PY" -c 'import sys, ssl, sqlite3, ctypes, zlib, lzma, bz2, venv, sysconfig
assert sys.version_info[:2] == (3, 14), sys.version
from pathlib import Path
for path in sysconfig.get_path("include"), sysconfig.get_config_var("WHEEL_PKG_DIR"):
    assert path.startswith(sys.argv[1]), (path, sys.argv[1])
assert list(Path(sysconfig.get_config_var("WHEEL_PKG_DIR")).glob("pip-*.whl"))' "$ROOT" >/dev/null 2>&1
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

PACKAGES=(
    python3.14 python3.14-minimal libpython3.14-minimal libpython3.14-stdlib libpython3.14
    libpython3.14-dev python3.14-dev python3.14-venv python3-pip-whl
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
bin="$ROOT/usr/bin/python3.14"
patchelf --set-interpreter "$loader" --force-rpath --set-rpath "$libs" "$bin"

# Debian's pyconfig.h includes <x86_64-linux-gnu/python3.14/pyconfig.h>, which a
# compiler finds under the machine's /usr/include, not the prefix's: include
# the prefix's own by a path relative to the header
inc="$ROOT/usr/include/python3.14"
if grep -q "include <$ARCH_TRIPLET/python3.14/pyconfig.h>" "$inc/pyconfig.h"; then
    sed -i "s|include <$ARCH_TRIPLET/python3.14/pyconfig.h>|include \"../$ARCH_TRIPLET/python3.14/pyconfig.h\"|" \
        "$inc/pyconfig.h"
fi

# ensurepip (-m venv) installs pip from WHEEL_PKG_DIR, /usr/share/python-wheels:
# the machine's pip there (if any) is not for 3.14; use sid's, in the prefix
for data in "$ROOT"/usr/lib/python3.14/_sysconfigdata_*.py; do
    sed -i "s|'WHEEL_PKG_DIR': '/usr/share/python-wheels/'|'WHEEL_PKG_DIR': '$ROOT/usr/share/python-wheels/'|" "$data"
done

ln -sfn "$bin" "$PY"
ln -sfn python3.14 "$PREFIX/bin/python3"

# sysconfig's prefix comes from the binary's real path: a venv made from the link
# still reads the headers under ROOT/usr/include (check asserts it)
if ! check; then
    say "the interpreter does not work:"
    "$PY" -c 'import sys, sysconfig; print(sys.version); print(sysconfig.get_path("include"))' >&2 || true
    exit 1
fi
touch "$STAMP"
say "$("$PY" -c 'import sys; print(sys.version.split()[0])') ready"
echo "$PY"
