"""A CPU training loop under otelprof that runs out of memory at step N, for test_oom.py:
the address space is bounded (``RLIMIT_AS``) and step N allocates past it. The error escapes
the loop, as it would in a real job.

    python oom_train.py N [bare | gap]

``bare``: the same loop without otelprof (the traceback a user sees without it); ``gap``: the
batches come from a DataLoader (a step ends at the next fetch) and step N runs out of memory
after its update, before the next fetch.
"""

import resource
import sys

import torch

import otelprof


def _vm_size() -> int:
    with open("/proc/self/status", "rb") as f:
        for line in f:
            if line.startswith(b"VmSize:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize")


def main() -> None:
    fail_at, bare, gap = int(sys.argv[1]), sys.argv[2:] == ["bare"], sys.argv[2:] == ["gap"]
    if not bare:
        otelprof.instrument()
    torch.manual_seed(0)
    model = torch.nn.Linear(32, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    headroom = 1 << 30
    resource.setrlimit(resource.RLIMIT_AS, (_vm_size() + headroom, resource.RLIM_INFINITY))
    if gap:
        data = torch.utils.data.TensorDataset(torch.randn(16 * (fail_at + 2), 32))
        for step, (x,) in enumerate(torch.utils.data.DataLoader(data, batch_size=16)):
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
            if step == fail_at:
                torch.empty(4 * headroom // 4, dtype=torch.float32)  # after the update: past the limit
        return
    for step in range(fail_at + 1):
        x = torch.randn(16, 32)
        if step == fail_at:
            x = torch.empty(4 * headroom // 4, dtype=torch.float32)  # 4 GiB: past the limit
        model(x[:16].view(16, 32)).sum().backward()
        opt.step()
        opt.zero_grad()


if __name__ == "__main__":
    main()
