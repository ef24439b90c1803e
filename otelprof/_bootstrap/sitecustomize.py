"""Put on PYTHONPATH by ``otelprof run``: instruments the Python process it starts, then hands
over to any ``sitecustomize`` this one shadows.

multiprocessing's spawned children (DataLoader workers with ``spawn``) inherit PYTHONPATH but
are not training loops: they are left alone.
"""

import importlib
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _chain() -> None:
    """Imports the next ``sitecustomize`` on the path, the one ours hides."""
    ours = sys.modules.pop("sitecustomize")
    saved = sys.path[:]
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
    try:
        importlib.import_module("sitecustomize")
    except ImportError:
        pass
    finally:
        sys.path[:] = saved
        # the import of ours is still under way: importlib takes the name back out of
        # sys.modules when it finishes, and reports an error if it is gone
        sys.modules.setdefault("sitecustomize", ours)


def _instrument() -> None:
    if "--multiprocessing-fork" in getattr(sys, "orig_argv", sys.argv):
        return
    try:
        import otelprof.auto  # noqa: F401
    except Exception as exc:  # never stop the job from starting
        sys.stderr.write(f"otelprof: not instrumenting: {exc}\n")


_chain()
_instrument()
