"""A DataLoader training loop that runs until it is signalled, for test_preemption.py.

    python preempt_loop.py TRUTH_FILE HANDLER [--auto]

After each optimizer update the loop writes how many updates it has completed to TRUTH_FILE
(its own truth). HANDLER is the loop's own SIGTERM disposition, set before otelprof instruments
(``--auto``) or after (``late-*``):
- ``default``: none (the process dies of SIGTERM);
- ``ignore``: SIG_IGN (SIGTERM does nothing; the loop stops after 40 more updates);
- ``flag``: a handler that asks the loop to stop; it prints "stopping" and exits 0;
- ``late-compose``: installed after instrument(), it records the signal and calls the handler
  that was there before (as Lightning's SignalConnector does), then the loop stops and exits 0.
"""

import os
import signal
import sys
import time
from typing import Any

HANDLER = sys.argv[2]
stop = False


def ask_to_stop(signum: int, frame: Any) -> None:
    global stop
    stop = True


if HANDLER == "ignore":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
elif HANDLER == "flag":
    signal.signal(signal.SIGTERM, ask_to_stop)

if "--auto" in sys.argv:
    import otelprof.auto  # noqa: F401

import torch  # noqa: E402 - after the handler the loop sets before otelprof instruments

if HANDLER == "late-compose":
    before = signal.getsignal(signal.SIGTERM)

    def compose(signum: int, frame: Any) -> None:
        ask_to_stop(signum, frame)
        if callable(before):
            before(signum, frame)

    signal.signal(signal.SIGTERM, compose)


def main() -> None:
    truth = sys.argv[1]
    torch.manual_seed(0)
    data = torch.randint(0, 50, (100_000, 8))
    loader: Any = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(data), batch_size=4)
    model = torch.nn.Sequential(torch.nn.Embedding(50, 16), torch.nn.Flatten(), torch.nn.Linear(128, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    updates, left = 0, 40
    deadline = time.monotonic() + 90  # a test that never signals still ends
    for (batch,) in loader:
        model(batch).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        updates += 1
        with open(truth + ".tmp", "w") as f:
            f.write(str(updates))
        os.replace(truth + ".tmp", truth)
        time.sleep(0.005)
        if stop or time.monotonic() > deadline:
            break
        if HANDLER == "ignore" and os.path.exists(truth + ".signalled"):
            left -= 1
            if not left:
                break
    print("stopping", updates, flush=True)


if __name__ == "__main__":
    main()
