"""The sanitizer build is wired up: a CMake option, a script that uses it, and CI running the script.

Nothing is built here; ``.ci/sanitize`` itself builds and runs the tests (docs/development.md).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / ".ci" / "sanitize"


def _cmake() -> str:
    return (REPO_ROOT / "CMakeLists.txt").read_text("utf-8")


def _script() -> str:
    return SCRIPT.read_text("utf-8")


def test_cmake_has_the_sanitize_and_werror_options() -> None:
    cmake = _cmake()
    assert re.search(r'^option\(OTELPROF_SANITIZE "[^"]+" OFF\)$', cmake, re.MULTILINE)
    assert re.search(r'^option\(OTELPROF_WERROR "[^"]+" OFF\)$', cmake, re.MULTILINE)


def test_cmake_applies_warnings_and_sanitizers_to_the_core_and_the_module() -> None:
    cmake = _cmake()
    loop = re.search(r"^foreach\(target ([^)\n]+)\)\n(.*?)^endforeach\(\)$", cmake, re.MULTILINE | re.DOTALL)
    assert loop, "one loop gives both targets the same flags"
    assert set(loop.group(1).split()) == {"otelprof_core", "_native", "${OTELPROF_CHECKS}"}
    assert "add_executable(otelprof_leak_check native/tests/leak_check.cpp)" in cmake
    body = loop.group(2)
    assert "-Wall -Wextra $<$<BOOL:${OTELPROF_WERROR}>:-Werror>" in body
    assert "if(OTELPROF_SANITIZE)" in body
    assert "-fsanitize=address,undefined -fno-omit-frame-pointer" in body
    assert "-fno-sanitize-recover=undefined" in body
    assert "target_link_options(${target} PRIVATE -fsanitize=address,undefined)" in body


def test_cmake_builds_the_fuzzers_with_clang_only() -> None:
    cmake = _cmake()
    assert re.search(r'^option\(OTELPROF_FUZZ "[^"]+" OFF\)$', cmake, re.MULTILINE)
    assert 'message(FATAL_ERROR "OTELPROF_FUZZ needs clang (libFuzzer)")' in cmake
    assert "target_compile_options(otelprof_core PRIVATE -fsanitize=fuzzer-no-link)" in cmake
    assert "foreach(fuzzer json gzip)" in cmake
    for fuzzer in ("json", "gzip"):
        assert (REPO_ROOT / "native" / "tests" / f"fuzz_{fuzzer}.cpp").is_file()


def test_ci_runs_the_sanitizer_and_fuzz_scripts_after_the_tests() -> None:
    lines = [line for line in (REPO_ROOT / ".ci" / "run").read_text("utf-8").splitlines() if line.strip()]
    test_line = next(i for i, line in enumerate(lines) if "python -m pytest" in line)
    after = lines[test_line + 1 :]
    assert ".ci/sanitize" in after
    assert ".ci/fuzz" in after


def test_fuzz_script_is_bounded_and_sanitized() -> None:
    script = (REPO_ROOT / ".ci" / "fuzz").read_text("utf-8")
    assert (REPO_ROOT / ".ci" / "fuzz").stat().st_mode & 0o111
    assert "set -euo pipefail" in script
    assert "seconds=${OTELPROF_FUZZ_SECONDS:-30}" in script
    assert '-max_total_time="$seconds"' in script
    assert "-DOTELPROF_SANITIZE=ON -DOTELPROF_FUZZ=ON" in script
    assert "for fuzzer in json gzip; do" in script
    assert "export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1" in script


def test_script_builds_sanitized_with_warnings_as_errors_away_from_the_install() -> None:
    script = _script()
    assert SCRIPT.stat().st_mode & 0o111, ".ci/run calls it directly"
    assert script.startswith("#!/usr/bin/env bash\n")
    assert "set -euo pipefail" in script
    assert "-DOTELPROF_SANITIZE=ON -DOTELPROF_WERROR=ON" in script
    assert "out=build/sanitize" in script
    assert "pip install -e" not in script, "the editable install is left as it is"
    assert "grep -w __asan_init" in script, "the module under test is checked to be the sanitized one"


def test_script_runs_the_tests_under_the_sanitizers() -> None:
    script = _script()
    assert 'LD_PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libstdc++.so)"' in script
    assert "export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1" in script
    assert "export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1" in script
    assert "export OTELPROF_REQUIRE_NATIVE=true" in script
    assert (REPO_ROOT / ".ci" / "sanitize_site" / "sitecustomize.py").is_file()


def test_every_test_path_the_script_runs_exists() -> None:
    words = shlex.split(_script().split("-m pytest", 1)[1], comments=True)
    paths = [word for word in words if word.startswith("tests/")]
    assert len(paths) >= 10
    missing = [path for path in paths if not (REPO_ROOT / path.split("::")[0]).exists()]
    assert not missing
