"""Who this process is in a job: run id, rank, local rank and world size from launchers
(``identity``); from torch.distributed, and the straggler ratio across ranks (``ranks``)."""
