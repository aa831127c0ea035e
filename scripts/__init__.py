"""The project's scripts (run as files: ``python scripts/ci.py``), and, in
``scripts/corpus/``, what they share with the tests. A package, so that
``scripts.corpus`` is found here before any other ``scripts`` on the path."""
