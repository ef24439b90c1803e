"""Who a process is, from each launcher's variables; bad values warn and fall back."""

from __future__ import annotations

import pytest

from otelprof.capture.config import settings_from_env
from otelprof.capture.distributed.identity import Identity, identity_from_env


def test_torchrun() -> None:
    env = {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "TORCHELASTIC_RUN_ID": "job-7"}
    assert identity_from_env(env) == Identity("job-7", 3, 1, 8, "TORCHELASTIC_RUN_ID")


def test_otelprof_run_id_wins_and_slurm_ranks() -> None:
    env = {
        "SLURM_PROCID": "5",
        "SLURM_LOCALID": "1",
        "SLURM_NTASKS": "16",
        "SLURM_JOB_ID": "991",
        "OTELPROF_RUN_ID": "r",
    }
    assert identity_from_env(env) == Identity("r", 5, 1, 16, "OTELPROF_RUN_ID")


def test_single_process_gets_a_random_run_id() -> None:
    a, b = identity_from_env({}), identity_from_env({})
    assert (a.rank, a.local_rank, a.world_size, a.run_id_source) == (0, 0, 1, "random")
    assert a.run_id != b.run_id


def test_bad_values_warn_and_fall_back(caplog: pytest.LogCaptureFixture) -> None:
    ident = identity_from_env({"RANK": "two", "LOCAL_RANK": "-1", "WORLD_SIZE": "0", "OTELPROF_RUN_ID": "x"})
    assert (ident.rank, ident.local_rank, ident.world_size) == (0, 0, 1)
    settings = settings_from_env({"OTEL_EXPORTER_PROMETHEUS_PORT": "99999", "OTELPROF_ENABLED": "maybe"})
    assert (settings.metrics_port, settings.enabled) == (9464, True)
    messages = [r.getMessage() for r in caplog.records]
    assert "RANK='two' is not an integer from 0 to 2147483647; using 0" in messages
    assert "OTEL_EXPORTER_PROMETHEUS_PORT='99999' is not an integer from 0 to 65535; using 9464" in messages
    assert "OTELPROF_ENABLED='maybe' is not true or false; using true" in messages


def test_hostile_ranks_and_run_ids_fall_back(caplog: pytest.LogCaptureFixture) -> None:
    """A rank past int32 would make a world size no converter option takes; a run id that is
    not UTF-8 cannot be a label, and a huge one would be on every metric sample."""
    huge = identity_from_env({"RANK": str(2**63 - 1), "WORLD_SIZE": str(2**63), "OTELPROF_RUN_ID": "r\udcff"})
    assert (huge.rank, huge.world_size) == (0, 1)
    assert huge.run_id_source == "random"
    long = identity_from_env({"OTELPROF_RUN_ID": "x" * 100_000})
    assert long.run_id == "x" * 256 and long.run_id_source == "OTELPROF_RUN_ID"
    messages = [r.getMessage() for r in caplog.records]
    assert "OTELPROF_RUN_ID is not UTF-8 text; ignored as a run id" in messages
    assert "OTELPROF_RUN_ID is 100000 characters long; its first 256 are the run id" in messages
