"""Linear layers of known shape trained on the CPU under otelprof, with one with_flops window
(the test sets the environment); before it exits (and pushes its last OTLP export) it saves its
own /metrics once the window's FLOPs are in. Run by test_mfu.py.

    python mfu_loop.py STEPS OUT_FILE M K H N

Input m x k, hidden h, output n: addmm forward, mm backward (test_mfu.analytic_flops).
"""

import sys
import time
import urllib.request
from pathlib import Path

import torch

import otelprof.auto  # noqa: F401
from otelprof.capture.session import session


def main() -> None:
    steps, out = int(sys.argv[1]), Path(sys.argv[2])
    m, k, h, n = map(int, sys.argv[3:7])
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(k, h), torch.nn.ReLU(), torch.nn.Linear(h, n))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(m, k)  # no grad: autograd computes no input gradient of the first layer
    for _ in range(steps):
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()
    current = session()
    assert current is not None and current.mfu is not None and current.metrics_port is not None
    deadline = time.monotonic() + 60
    while current.mfu.last is None and time.monotonic() < deadline:  # converted on a thread of its own
        time.sleep(0.05)
    with urllib.request.urlopen(f"http://127.0.0.1:{current.metrics_port}/metrics", timeout=10) as response:
        out.write_text(response.read().decode())
    print("trained", steps, flush=True)


if __name__ == "__main__":
    main()
