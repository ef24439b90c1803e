"""The demo's training job: a tiny transformer language model on random tokens, on the CPU.

It is a plain training loop with no otelprof code in it: ``otelprof demo`` runs it under
``otelprof run``, which instruments it. At the end it writes what the instrumentation saw
(read back from the live session) as JSON to the path in argv, for ``otelprof demo`` to print.

    python -m otelprof._demo_train STEPS SUMMARY.json
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any


def train(steps: int) -> None:
    import torch
    from torch import nn

    torch.manual_seed(0)
    torch.set_num_threads(1)  # the model is too small to gain from more; keeps timings steady
    vocab, seq_len, batch, width = 512, 32, 8, 64
    tokens = torch.randint(0, vocab, (steps * batch, seq_len + 1))
    loader: torch.utils.data.DataLoader[tuple[torch.Tensor, ...]] = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(tokens), batch_size=batch
    )
    model = nn.Sequential(
        nn.Embedding(vocab, width),
        nn.TransformerEncoderLayer(width, nhead=4, dim_feedforward=4 * width, dropout=0.0, batch_first=True),
        nn.Linear(width, vocab),
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    for (batch_tokens,) in loader:
        inputs, targets = batch_tokens[:, :-1], batch_tokens[:, 1:]
        loss = loss_fn(model(inputs).reshape(-1, vocab), targets.reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()


def summary(train_seconds: float) -> dict[str, Any]:
    """What the session recorded; uninstruments (flushing every step, window and request)."""
    from prometheus_client import REGISTRY

    import otelprof
    from otelprof.instrumentation import session

    live = session()
    if live is None or live.metrics is None:
        return {"instrumented": False, "train_seconds": train_seconds}
    labels = live.identity.labels()
    count = REGISTRY.get_sample_value("otelprof_step_duration_seconds_count", labels) or 0
    total = REGISTRY.get_sample_value("otelprof_step_duration_seconds_sum", labels) or 0.0
    metrics_port = live.metrics_port
    otelprof.uninstrument()  # flushes the last steps, converts the last window, drains the queue
    windows: dict[str, Any] = {}
    if live.windows is not None and live.windows.metrics is not None:
        done, _failed, last = live.windows.metrics.snapshot()
        windows = {trigger: count for trigger, count in done.items() if count}
        if last is not None:
            windows["top_ops"] = last.op_self_cpu_s
    requests = {
        result: int(
            REGISTRY.get_sample_value("otelprof_export_requests_total", {"signal": "traces", "result": result}) or 0
        )
        for result in ("exported", "spooled", "dropped")
    }
    exporter = live.exporter
    return {
        "instrumented": True,
        "train_seconds": train_seconds,
        "run_id": live.identity.run_id,
        "steps": int(count),
        "mean_step_seconds": total / count if count else None,
        "windows": windows,
        "requests": requests,
        "endpoint": exporter.config.url if exporter is not None and exporter.config.endpoint_configured else None,
        "spool_dir": str(exporter.spool.directory) if exporter is not None else None,
        "metrics_port": metrics_port,
    }


def main() -> None:
    steps, out = int(sys.argv[1]), sys.argv[2]
    started = time.perf_counter()
    train(steps)
    result = summary(time.perf_counter() - started)
    with open(out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
