"""A small training loop run as its own process by the entry-point tests.

    python train_loop.py STEPS NUM_WORKERS [--auto] [--spawn]

--auto imports otelprof.auto first (the one-line integration); otherwise the process is left
to whatever instrumented it (otelprof run, opentelemetry-instrument).
"""

import sys

if "--auto" in sys.argv:
    import otelprof.auto  # noqa: F401

import torch


def main() -> None:
    steps, workers = int(sys.argv[1]), int(sys.argv[2])
    torch.manual_seed(0)
    data = torch.randint(0, 50, (steps * 4, 8))
    context = "spawn" if "--spawn" in sys.argv and workers else None
    dataset = torch.utils.data.TensorDataset(data)
    loader = torch.utils.data.DataLoader(dataset, batch_size=4, num_workers=workers, multiprocessing_context=context)
    model = torch.nn.Sequential(torch.nn.Embedding(50, 16), torch.nn.Flatten(), torch.nn.Linear(128, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for (batch,) in loader:
        model(batch).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    print("trained", steps, flush=True)


if __name__ == "__main__":
    main()
