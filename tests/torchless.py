"""A pytest plugin (`-p tests.torchless`) under which importing torch is an error, for
tests/test_collection.py: it collects every test module that runs no model under it, and each one
that imports torch at collection (itself, or through a helper or a package it imports at its top)
is an ERROR naming it. Imports nothing itself."""

from __future__ import annotations

import sys

MESSAGE = "torch imported while collecting a module that runs no model (see tests/test_collection.py)"


class RefuseTorch:
    """A meta path finder that refuses torch and its submodules, and lets everything else by."""

    def find_spec(self, name: str, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError(f"{MESSAGE}: import {name}", name=name)
        return None


def pytest_configure(config) -> None:
    if "torch" in sys.modules:  # a plugin imported it before collection: nothing could be refused
        raise RuntimeError(f"torch was imported before collection started; {MESSAGE}")
    sys.meta_path.insert(0, RefuseTorch())
