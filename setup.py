"""Builds the optional C engine, pytree_kit._speedups.

Everything else is in pyproject.toml. When the extension cannot be compiled
(no compiler, no Python headers, another Python implementation), the install
says so in one line starting with ``pytree_kit:`` and goes on with the
pure-Python engine; ``pytree_kit.engine_info()`` then says which engine runs
and why. Set these in the environment of the build:

- ``PYTREE_KIT_REQUIRE_C=1``: a C engine that cannot be built is an error.
- ``PYTREE_KIT_NO_FAST_PATHS=1``: build the C engine without the fast paths
  that read CPython's own layouts (for testing the fallbacks; slower).
- ``PYTREE_KIT_CFLAGS`` / ``PYTREE_KIT_LDFLAGS``: extra compiler and linker
  flags (the sanitizer builds, ``-Werror`` in CI).
"""

import os
import platform
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


def _flag(name: str) -> bool:
    return os.environ.get(name, "") not in ("", "0")


require_c = _flag("PYTREE_KIT_REQUIRE_C")
FALLBACK = (
    "pytree_kit: the C engine could not be built ({why}); installing the pure-Python "
    "engine, which is 10 to 20 times slower (set PYTREE_KIT_REQUIRE_C=1 to make this an error; "
    "for the C engine, install a wheel, or a C compiler and Python's headers and reinstall)"
)
#: beside the extension's place in the package, why it is not there: the
#: engine reads it (pytree_kit._engine, engine_info()["reason"]), since pip
#: shows a build's output only with -v
NOT_BUILT = "_speedups.not-built.txt"


class BuildExt(build_ext):
    """build_ext that, unless the C engine is required, turns a failed build
    into one clear line, a note in the package saying why, and an install of
    the pure engine."""

    def build_extension(self, ext: Extension) -> None:
        note = os.path.join(os.path.dirname(self.get_ext_fullpath(ext.name)), NOT_BUILT)
        try:
            super().build_extension(ext)
        except Exception as exc:  # no compiler, a compiler or a linker error
            if require_c:
                raise
            why = " ".join(f"{type(exc).__name__}: {exc}".split())
            if len(why) > 200:
                why = why[:200] + "..."
            print(FALLBACK.format(why=why), file=sys.stderr, flush=True)
            os.makedirs(os.path.dirname(note), exist_ok=True)
            with open(note, "w", encoding="utf-8") as f:
                f.write(why + "\n")
        else:
            if os.path.exists(note):  # from an earlier build that failed
                os.remove(note)


#: The C engine's parts (_core.h has their map). Each compiles on its own
#: against _core.h; they are built as one unit, _one_unit.c, which #includes
#: them all, so that the compiler inlines across them (PYTREE_KIT_C_UNITS=one,
#: the default), or as separate objects (=separate), with link-time
#: optimisation (=lto). benchmarks/results/c_units.md has the measured
#: difference.
ENGINE_PARTS = [
    "_core",
    "_fast_type_version_tags",
    "_fast_odict_links",
    "_fast_dict_reads",
    "_fast_dict_tables",
    "_fast_split_values",
    "_memo",
    "_class_plans",
    "_stack",
    "_classify",
    "_mapping_kind",
    "_flatten",
    "_specread",
    "_unflatten",
    "_up_to",
    "_speedups",
]
#: compiled on their own whatever the mode (_speedups.h, _for_torch.h)
OTHER_SOURCES = ["_fastcall", "_reach", "_specops", "_rows"]
units = os.environ.get("PYTREE_KIT_C_UNITS", "one")
if units not in ("one", "separate", "lto"):
    raise SystemExit(f"PYTREE_KIT_C_UNITS={units!r}: one, separate or lto")
parts = ["_one_unit"] if units == "one" else ENGINE_PARTS
macros = [("PK_NO_FAST_PATHS", "1")] if _flag("PYTREE_KIT_NO_FAST_PATHS") else []
if units == "one":
    macros.append(("PK_ONE_UNIT", "1"))
#: PYTREE_KIT_WITHOUT=dict_tables,split_values,...: those fast paths left out,
#: one at a time, to measure what each buys (benchmarks/fast_paths.py)
FAST_PATH_NAMES = (
    "type_version_tags", "dict_reads", "dict_tables", "split_values", "odict_links",
    "spare_tuples", "defer_tracking",
)  # fmt: skip
for name in filter(None, os.environ.get("PYTREE_KIT_WITHOUT", "").split(",")):
    if name not in FAST_PATH_NAMES:
        raise SystemExit(f"PYTREE_KIT_WITHOUT: {name!r} is none of {', '.join(FAST_PATH_NAMES)}")
    macros.append((f"PK_WITHOUT_{name.upper()}", "1"))
lto = ["-flto"] if units == "lto" else []

ext_modules = []
if platform.python_implementation() == "CPython" or require_c:
    ext_modules.append(
        Extension(
            "pytree_kit._speedups",
            sources=[f"pytree_kit/{name}.c" for name in (*parts, *OTHER_SOURCES)],
            depends=[
                "pytree_kit/_speedups.h",
                "pytree_kit/_for_torch.h",
                "pytree_kit/_core.h",
                "pytree_kit/_layouts.h",
                *(f"pytree_kit/{name}.c" for name in ENGINE_PARTS),
            ],
            optional=not require_c,  # with the extension missing, the install goes on
            define_macros=macros,
            extra_compile_args=[*lto, *os.environ.get("PYTREE_KIT_CFLAGS", "").split()],
            extra_link_args=[*lto, *os.environ.get("PYTREE_KIT_LDFLAGS", "").split()],
        )
    )

setup(ext_modules=ext_modules, cmdclass={"build_ext": BuildExt})
