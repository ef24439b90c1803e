"""Execution traces paired with the Kineto traces of the same process, as HTA and PARAM's
``et_replay`` pair them: by file, never by guessing.

An execution trace pairs with the Kineto trace in its folder that has the same name once each
file's suffix is dropped (otelprof's kept windows: ``<name>.pt.trace.json.gz`` beside
``<name>.et.json.gz``), else with the one Kineto trace of its folder that has its rank (the
execution trace's from its name, as ``rank-3`` or ``worker3``; the Kineto trace's from its
``distributedInfo``, else its name) where that rank is held by exactly one of each.
Anything else is left unpaired: an execution trace with no partner is reported and counted, not
imported; a Kineto trace in a folder with execution traces none of which pairs with it is
imported without one, and counted (discover.py makes the sources of what this decides).
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

_log = logging.getLogger(__name__)

_ET_SUFFIXES = (".et.json.gz", ".et.json", ".json.gz", ".json")
_KINETO_SUFFIXES = (".pt.trace.json.gz", ".pt.trace.json", ".json.gz", ".json")


@dataclass
class Pairs:
    partner: dict[Path, Path] = field(default_factory=dict)  # Kineto trace -> its execution trace
    unpaired: list[Path] = field(default_factory=list)  # execution traces with no partner
    missing: set[Path] = field(default_factory=set)  # Kineto traces beside execution traces, none theirs


def _stem(name: str, suffixes: tuple[str, ...]) -> str:
    return next((name[: -len(s)] for s in suffixes if name.endswith(s) and len(name) > len(s)), name)


def pair(kineto: dict[Path, int | None], execution_traces: dict[Path, int | None]) -> Pairs:
    """Pairs ``execution_traces`` with ``kineto`` traces (each path with its rank, or None)."""
    out = Pairs()
    if not execution_traces:
        return out
    by_name = {(k.parent, _stem(k.name, _KINETO_SUFFIXES)): k for k in kineto}
    left = []
    for et in execution_traces:
        k = by_name.get((et.parent, _stem(et.name, _ET_SUFFIXES)))
        if k is not None and k not in out.partner:
            out.partner[k] = et
        else:
            left.append(et)
    # by rank, where a folder's rank is held by one execution trace and one Kineto trace left
    et_ranks = Counter((et.parent, execution_traces[et]) for et in left)
    k_ranks = Counter((k.parent, rank) for k, rank in kineto.items() if k not in out.partner)
    for et in left:
        key = (et.parent, execution_traces[et])
        match = [k for k, rank in kineto.items() if k not in out.partner and (k.parent, rank) == key]
        if key[1] is not None and et_ranks[key] == 1 and k_ranks[key] == 1 and len(match) == 1:
            out.partner[match[0]] = et
        else:
            _log.warning("%s: an execution trace with no Kineto trace to pair with (by name or rank); not imported", et)
            out.unpaired.append(et)
    folders = {et.parent for et in execution_traces}
    for k in kineto:
        if k not in out.partner and k.parent in folders:
            _log.warning("%s: no execution trace pairs with this Kineto trace; imported without one", k)
            out.missing.add(k)
    return out
