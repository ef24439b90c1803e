"""The ``otelprof summary --sort`` keys, apart from the tables (``report/summary.py``): the
command line lists them in its help, and building the parser must not import the converter
and protobuf's message classes."""

from __future__ import annotations

#: --sort keys; torch's ``sort_by`` names are accepted as aliases.
SORT_KEYS = ("self_cpu", "cpu_total", "self_device", "device_total", "calls", "name")
SORT_ALIASES = {
    "self_cpu_time_total": "self_cpu",
    "cpu_time_total": "cpu_total",
    "self_device_time_total": "self_device",
    "self_cuda_time_total": "self_device",
    "device_time_total": "device_total",
    "cuda_time_total": "device_total",
    "count": "calls",
}


def sort_key(name: str) -> str:
    """A --sort value (or torch alias) as one of SORT_KEYS; ValueError when unknown."""
    key = SORT_ALIASES.get(name, name)
    if key not in SORT_KEYS:
        raise ValueError(f"unknown sort key {name!r} (one of {', '.join(SORT_KEYS)})")
    return key


__all__ = ["SORT_ALIASES", "SORT_KEYS", "sort_key"]
