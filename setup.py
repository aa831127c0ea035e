"""Builds the optional C engine, pytree_kit._speedups.

Everything else is in pyproject.toml. When the extension cannot be compiled
(no compiler, another Python implementation), the install goes on and
pytree_kit uses its pure-Python engine; set PYTREE_KIT_REQUIRE_C=1 to make
that an error instead.
"""

import os
import platform

from setuptools import Extension, setup

require_c = os.environ.get("PYTREE_KIT_REQUIRE_C", "") not in ("", "0")
ext_modules = []
if platform.python_implementation() == "CPython" or require_c:
    ext_modules.append(
        Extension(
            "pytree_kit._speedups",
            sources=["pytree_kit/_speedups.c", "pytree_kit/_fastcall.c"],
            depends=["pytree_kit/_speedups.h"],
            optional=not require_c,
            extra_compile_args=os.environ.get("PYTREE_KIT_CFLAGS", "").split(),
            extra_link_args=os.environ.get("PYTREE_KIT_LDFLAGS", "").split(),
        )
    )

setup(ext_modules=ext_modules)
