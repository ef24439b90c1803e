"""Loads the sanitized ``otelprof._native`` (.ci/sanitize puts this folder on PYTHONPATH).

A finder ahead of the editable install's, for that one module: the rest of the package is the
working tree's, and the editable install's own module is left as it is.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys

_MODULE = os.environ["OTELPROF_SANITIZED_MODULE"]


class _SanitizedNative:
    @staticmethod
    def find_spec(fullname: str, path: object = None, target: object = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != "otelprof._native":
            return None
        return importlib.util.spec_from_file_location(fullname, _MODULE)


sys.meta_path.insert(0, _SanitizedNative())
