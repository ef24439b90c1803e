"""Step detection: the step rules (``tracker``: the Python reference; ``native_tracker``: the
native core's, and the choice between them; ``step``: the record both close), the torch
hooks that feed them (``hooks``), torch.compile compatibility (``dynamo``) and device times
from CUDA events (``device_timing``)."""
