"""Debian's Prometheus tools for the stack tests: found on PATH, or installed with apt-get when
running in CI (CI=true, root, Debian): `prometheus`, `promtool` (package prometheus) and
`amtool` (package prometheus-alertmanager). ``install_in_ci`` also serves ``tests/ui``
(chromium)."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

PACKAGES = ("prometheus", "prometheus-alertmanager")
_POLICY = Path("/usr/sbin/policy-rc.d")
_lock = threading.Lock()
_tried: set[tuple[str, ...]] = set()  # package sets apt-get was run for (once per process)


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def apt_install(packages: Sequence[str] = PACKAGES) -> str:
    """Installs the packages without starting their services; returns apt's output tail."""
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    # a policy-rc.d that says "no" keeps postinst from starting prometheus on :9090 (the test
    # starts its own); only put in place when none exists, and removed after
    own_policy = not _POLICY.exists()
    if own_policy:
        _POLICY.write_text("#!/bin/sh\nexit 101\n")
        _POLICY.chmod(0o755)
    try:
        out = []
        for cmd in (
            ["apt-get", "update", "-qq"],
            ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages],
        ):
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, check=False)
            out.append(done.stdout[-2000:] + done.stderr[-2000:])
            if done.returncode != 0:
                break
        return "\n".join(out)
    finally:
        if own_policy:
            _POLICY.unlink(missing_ok=True)


def install_in_ci(packages: Sequence[str]) -> str:
    """In CI (root, apt-get), installs ``packages`` the first time they are asked for; returns
    apt's output tail ("" when it did not run: not CI, not root, no apt-get, or tried before)."""
    key = tuple(packages)
    with _lock:
        if not in_ci() or key in _tried or not shutil.which("apt-get") or os.geteuid() != 0:
            return ""
        _tried.add(key)
        return apt_install(packages)


def require(tool: str) -> str:
    """The path of ``tool``; in CI it is installed when missing (and must then exist), elsewhere
    the calling test is skipped with the reason."""
    path = shutil.which(tool)
    if path:
        return path
    if not in_ci():
        pytest.skip(f"{tool} not found: apt-get install {' '.join(PACKAGES)} (CI=true installs it)")
    log = install_in_ci(PACKAGES)
    path = shutil.which(tool)
    if not path:
        pytest.fail(f"{tool} is needed in CI and could not be installed with apt-get:\n{log}")
    return path
