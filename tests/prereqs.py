"""What the tests need that the ``test`` extra cannot bring, pinned, and installed before the
tests by the README's test command (``python tests/prereqs.py``), never by a test.

- Debian packages: Prometheus, promtool and Alertmanager (the stack tests), Chromium and a font
  (the UI tests), simdjson's headers (the parse-floor benchmark).
- Arize Phoenix, in a virtual environment of its own (its web stack must not meet the test
  environment's packages).
- Composer (mosaicml), in a ``pip --target`` folder of its own (it pins an older torch).

Tests find these through ``found``: where one is missing, a test is skipped with the command that
installs it, and in CI (one definition: ``in_ci``) it fails instead, so a run cannot pass by
skipping. Run as a script, this module installs what is missing: apt packages only as root (a
developer's machine without root gets the command to run), the rest into the test cache.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

#: Debian 12 packages by upstream version (apt's ``pkg=version*``: a Debian security rebuild of
#: the same release still matches). Chromium is Debian's current one: bookworm-security replaces
#: each major release with the next, so an older pin would stop installing.
APT = {
    "prometheus": "2.42.0",
    "prometheus-alertmanager": "0.25.0",
    "chromium": "",
    "fonts-liberation": "1:1.07.4",
    "libsimdjson-dev": "3.0.1",
}
PHOENIX_VERSION = "20.26.1"
#: speedscope from npm (the flame-graph viewer the profiles test opens a window's pprof file in)
SPEEDSCOPE_VERSION = "1.25.0"
#: mosaicml 0.32.1 (the latest) pins torch<2.7.1: installed --no-deps beside the environment's
#: torch; the second list is pure Python and takes its dependencies.
COMPOSER = ["mosaicml==0.32.1", "torch_optimizer==0.3.0", "coolname==2.2.0", "tabulate==0.9.0", "py-cpuinfo==9.0.0"]
COMPOSER_WITH_DEPS = ["mosaicml-cli==0.7.5"]
PIP_TIMEOUT_S = 900

#: torchvision for the Composer folder (see tests/integrations/test_composer.py)
PLACEHOLDER = '''"""torchvision cannot load beside CPU torch 2.13 (see test_composer.py): every torchvision.*
module imports, and every name in it is a class whose use raises ImportError."""

import importlib.abc
import importlib.machinery
import sys
import types

import torch


class _Missing(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        qualname = f"{self.__name__}.{name}"

        def unavailable(*args, **kwargs):
            raise ImportError(f"torchvision is not installed here ({qualname})")

        base = torch.utils.data.Dataset if name.endswith("Dataset") else object
        value = type(name, (base,), {"__init__": unavailable})
        setattr(self, name, value)
        return value


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _Missing(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _Finder())
__path__ = []
'''


def in_ci() -> bool:
    """The one definition of "running in CI" for the tests (GitHub, GitLab and most set CI=true)."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def missing(what: str, how: str) -> NoReturn:
    """A prerequisite is absent: a failure in CI, else a skip that says how to install it."""
    import pytest

    message = f"{what} is missing; `{how}` installs it (the README's test command runs it)"
    if in_ci():
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def pytest_configure(config: object) -> None:
    """A pytest hook (tests/conftest.py takes it; ``-p prereqs`` elsewhere): in CI,
    ``pytest.importorskip`` fails instead of skipping, so a Python package the ``test`` extra
    should have brought (torch, mlflow, playwright, lightning...) cannot go missing unseen,
    whether a test or a whole module (a collection error) asked for it."""
    import pytest

    importorskip = pytest.importorskip
    if not in_ci() or getattr(importorskip, "fails_in_ci", False):
        return

    def importorskip_in_ci(modname: str, *args: object, **kwargs: object) -> object:
        try:
            return importorskip(modname, *args, **kwargs)  # type: ignore[arg-type]
        except pytest.skip.Exception as skipped:
            pytest.fail(f"a prerequisite is missing in CI: {skipped.msg}", pytrace=False)

    importorskip_in_ci.fails_in_ci = True  # type: ignore[attr-defined]
    pytest.importorskip = importorskip_in_ci


def cache_dir() -> Path:
    configured = os.environ.get("OTELPROF_TEST_CACHE", "").strip()
    return Path(configured) if configured else Path("/tmp/otelprof-test-cache")


def _py() -> str:
    return f"py{sys.version_info.major}.{sys.version_info.minor}"


def phoenix_venv() -> Path:
    configured = os.environ.get("OTELPROF_PHOENIX_VENV", "").strip()
    return Path(configured) if configured else cache_dir() / f"arize-phoenix-{PHOENIX_VERSION}-{_py()}"


def speedscope_dir() -> Path:
    return cache_dir() / f"speedscope-{SPEEDSCOPE_VERSION}"


def composer_dir() -> Path:
    return cache_dir() / f"composer-{COMPOSER[0].split('==')[1]}-{_py()}"


# --- what the tests call -------------------------------------------------------------------


def tool(name: str) -> str:
    """The path of an executable from the Debian packages above."""
    path = shutil.which(name)
    if path is None:
        missing(name, "python tests/prereqs.py")
    return path


def header(path: str) -> Path:
    found = Path(path)
    if not found.exists():
        missing(path, "python tests/prereqs.py")
    return found


def phoenix_python() -> Path:
    python = phoenix_venv() / "bin" / "python"
    if not _phoenix_installed(python):
        missing(f"arize-phoenix=={PHOENIX_VERSION} in {phoenix_venv()}", "python tests/prereqs.py")
    return python


def composer_paths() -> list[str]:
    """The PYTHONPATH entries of the Composer environment: the placeholder torchvision, the site."""
    folder = composer_dir()
    if not (folder / "ok").exists():
        missing(f"Composer in {folder}", "python tests/prereqs.py")
    return [str(folder / "placeholder"), str(folder / "site")]


def speedscope() -> Path:
    """The folder of speedscope's built web app (``index.html`` and its scripts)."""
    app = speedscope_dir() / "node_modules" / "speedscope" / "dist" / "release"
    if not (app / "index.html").exists():
        missing(f"speedscope@{SPEEDSCOPE_VERSION} in {speedscope_dir()}", "python tests/prereqs.py")
    return app


def _phoenix_installed(python: Path) -> bool:
    if not python.exists():
        return False
    probe = "import phoenix.server.main, importlib.metadata as m; print(m.version('arize-phoenix'))"
    done = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, timeout=120, check=False)
    return done.returncode == 0 and done.stdout.strip() == PHOENIX_VERSION


# --- installing (python tests/prereqs.py) --------------------------------------------------


def _run(command: Sequence[str], **env: str) -> None:
    print("+", " ".join(command), flush=True)
    done = subprocess.run(
        list(command), env={**os.environ, **env}, stdin=subprocess.DEVNULL, timeout=PIP_TIMEOUT_S, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"prereqs: `{' '.join(command)}` failed with exit code {done.returncode}")


def _apt_missing() -> list[str]:
    wanted = []
    for package, version in APT.items():
        query = ["dpkg-query", "-W", "-f=${Status} ${Version}", package]
        done = subprocess.run(query, capture_output=True, text=True, check=False)
        status, _, installed = done.stdout.partition(" installed ")
        if done.returncode != 0 or not status.endswith("ok") or not installed.startswith(version):
            wanted.append(f"{package}={version}*" if version else package)
    return wanted


def install_apt() -> None:
    wanted = _apt_missing()
    if not wanted:
        return
    command = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *wanted]
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        message = f"prereqs: not root (or no apt-get): run `sudo {' '.join(command)}`"
        if in_ci():
            raise SystemExit(message)
        print(message + "; the tests that need them skip until then", flush=True)
        return
    # a policy that says "no" keeps postinst from starting prometheus on :9090 (tests start
    # their own on free ports); put in place only when none exists, removed after
    policy = Path("/usr/sbin/policy-rc.d")
    own = not policy.exists()
    if own:
        policy.write_text("#!/bin/sh\nexit 101\n")
        policy.chmod(0o755)
    try:
        _run(["apt-get", "update", "-qq"], DEBIAN_FRONTEND="noninteractive")
        _run(command, DEBIAN_FRONTEND="noninteractive")
    finally:
        if own:
            policy.unlink(missing_ok=True)


def install_phoenix() -> None:
    venv = phoenix_venv()
    if _phoenix_installed(venv / "bin" / "python"):
        return
    building = venv.with_name(f"{venv.name}.building-{os.getpid()}")
    shutil.rmtree(building, ignore_errors=True)
    building.parent.mkdir(parents=True, exist_ok=True)
    _run([sys.executable, "-m", "venv", str(building)])
    pip = [str(building / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    _run([*pip, f"arize-phoenix=={PHOENIX_VERSION}"])
    shutil.rmtree(venv, ignore_errors=True)
    building.rename(venv)  # built beside, renamed when whole: a broken install is never taken


def install_composer() -> None:
    folder = composer_dir()
    if (folder / "ok").exists():
        return
    building = folder.with_name(f"{folder.name}.building-{os.getpid()}")
    shutil.rmtree(building, ignore_errors=True)
    site = building / "site"
    pip = [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--target", str(site)]
    _run([*pip, "--no-deps", *COMPOSER])
    _run([*pip, *COMPOSER_WITH_DEPS])
    if list(site.glob("torch-*")):
        raise SystemExit(f"prereqs: a torch went into the Composer folder {site}")
    placeholder = building / "placeholder" / "torchvision"
    placeholder.mkdir(parents=True)
    (placeholder / "__init__.py").write_text(PLACEHOLDER)
    (building / "ok").write_text("")
    shutil.rmtree(folder, ignore_errors=True)
    building.rename(folder)


def install_speedscope() -> None:
    folder = speedscope_dir()
    if (folder / "node_modules" / "speedscope" / "dist" / "release" / "index.html").exists():
        return
    building = folder.with_name(f"{folder.name}.building-{os.getpid()}")
    shutil.rmtree(building, ignore_errors=True)
    building.mkdir(parents=True)
    npm = shutil.which("npm")
    if npm is None:
        raise SystemExit("prereqs: npm is missing (Debian: apt-get install npm)")
    _run([npm, "install", "--prefix", str(building), "--no-audit", "--no-fund", f"speedscope@{SPEEDSCOPE_VERSION}"])
    shutil.rmtree(folder, ignore_errors=True)
    building.rename(folder)


def main() -> None:
    started = time.monotonic()
    install_apt()
    install_phoenix()
    install_composer()
    install_speedscope()
    print(f"prereqs: ready in {time.monotonic() - started:.0f} s", flush=True)


if __name__ == "__main__":
    main()
