"""pytree_kit's version (read by the build, pyproject.toml's dynamic version)."""

__version__ = "0.1.0"
