"""Step detection: the step rules (``tracker``: Python reference and native tracker), the torch
hooks that feed them (``hooks``), torch.compile compatibility (``dynamo``) and device times
from CUDA events (``device_timing``)."""
