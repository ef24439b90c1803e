"""Who this process is in a job: run id, rank, local rank, world size — from the launcher.

All ranks of a run must agree on the run id, because step N's trace id derives from it. It
comes from :envvar:`OTELPROF_RUN_ID`, else the launcher's job id (torchrun's
``TORCHELASTIC_RUN_ID``, Slurm's ``SLURM_JOB_ID``), else a random id, which rank 0 shares
with the others through torch.distributed at the first step (distributed.py).
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

from ...settings import Int, parse
from ...settings.variables import OTELPROF_RUN_ID

#: (rank, local rank, world size) variables of the launchers we know, first match wins.
_LAUNCHERS = (
    ("RANK", "LOCAL_RANK", "WORLD_SIZE"),  # torchrun, torch.distributed.launch, most wrappers
    ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_SIZE"),
)
_RUN_IDS = (OTELPROF_RUN_ID, "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID")
#: Ranks as torch.distributed counts them (int32); a run id is a label on every metric sample.
_MAX_RANK = 2**31 - 1
MAX_RUN_ID_LENGTH = 256

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Identity:
    run_id: str
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    run_id_source: str = "random"

    def labels(self) -> dict[str, str]:
        return {"run": self.run_id, "rank": str(self.rank), "local_rank": str(self.local_rank)}


def identity_from_env(environ: Mapping[str, str] = os.environ) -> Identity:
    rank, local, world = 0, 0, 1
    for rank_var, local_var, world_var in _LAUNCHERS:
        if environ.get(rank_var, "").strip():
            rank = parse(environ, rank_var, Int(0, _MAX_RANK), 0)
            local = parse(environ, local_var, Int(0, _MAX_RANK), 0)
            world = max(parse(environ, world_var, Int(1, _MAX_RANK + 1), 1), rank + 1)
            break
    for name in _RUN_IDS:
        value = _run_id(environ, name)
        if value is not None:
            return Identity(value, rank, local, world, name)
    return Identity(uuid.uuid4().hex, rank, local, world)


def _run_id(environ: Mapping[str, str], name: str) -> str | None:
    """The run id ``name`` gives: None when unset, torchrun's placeholder ``none``, or not
    UTF-8 (warned); cut to MAX_RUN_ID_LENGTH (warned; every rank cuts it alike, so they agree)."""
    value = environ.get(name, "").strip()
    if not value or value == "none":  # torchrun's placeholder when no rendezvous id is given
        return None
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # bytes the OS gave that are not UTF-8 (surrogate escapes)
        _log.warning("%s is not UTF-8 text; ignored as a run id", name)
        return None
    if len(value) > MAX_RUN_ID_LENGTH:
        _log.warning("%s is %d characters long; its first %d are the run id", name, len(value), MAX_RUN_ID_LENGTH)
        value = value[:MAX_RUN_ID_LENGTH]
    return value
