"""Live capture, one sub-package per part:

- ``steps``: where a step begins and ends and its phases (``tracker``), the torch hooks that feed
  it (``hooks``), keeping them out of torch.compile's way (``dynamo``), device times from CUDA
  events (``device_timing``);
- ``metrics``: the step metrics (``step_metrics``), the same over OTLP (``otlp_metrics``), what
  the last profiling window found (``window_metrics``), the /metrics endpoint (``server``);
- ``spans``: a span per step with its phases (``step_spans``);
- ``windows``: torch.profiler windows and their conversion (``profiling``), their requests given
  the session's resource (``resource``);
- ``distributed``: run id, rank and world size from launchers (``identity``) and from
  torch.distributed, and the straggler ratio (``ranks``);
- ``session``: the session that wires these together (``otelprof.instrumentation`` is its
  public face).
"""
