#!/usr/bin/env bash
# Makes CPython 3.14 from Debian's packages: scripts/python_debian.sh 3.14,
# kept under this name for the commands and pages that name it.
#
#     bash scripts/python314.sh        # prints the interpreter's path, last line
#
# Into PYTREE_KIT_PY314_PREFIX (default ~/.cache/pytree_kit/python3.14);
# scripts/python_debian.sh says what it does.
set -euo pipefail
exec bash "$(dirname "${BASH_SOURCE[0]}")/python_debian.sh" 3.14 "$@"
