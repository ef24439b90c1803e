"""A short CPU training run with one profiling window, its metrics on both paths (the test
sets OTEL_METRICS_EXPORTER=prometheus,otlp); before it exits (and pushes its last OTLP
export) it saves its own /metrics, once the window is converted. Run by test_metric_paths.py.

    python metric_paths_run.py OUT_FILE
"""

import re
import runpy
import sys
import time
import urllib.request
from pathlib import Path

import otelprof.auto  # noqa: F401
from otelprof.capture.session import session

HERE = Path(__file__).resolve().parent
#: the window's series are exposed once it is converted (a background thread)
WINDOW_DONE = re.compile(r"^otelprof_profiling_windows_total\{.*\} [1-9]", re.M)


def main() -> None:
    out = Path(sys.argv[1])
    sys.argv = ["train_loop.py", "8", "0"]
    runpy.run_path(str(HERE.parent / "capture" / "train_loop.py"), run_name="__main__")
    current = session()
    assert current is not None and current.metrics_port is not None
    url = f"http://127.0.0.1:{current.metrics_port}/metrics"
    deadline = time.monotonic() + 60
    while True:
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
        if WINDOW_DONE.search(text) or time.monotonic() > deadline:  # else the test says what is missing
            break
        time.sleep(0.2)
    out.write_text(text)


if __name__ == "__main__":
    main()
