"""Where a profiling window's memory went, by category (torch's memory timeline), per device
and per recorded step: computed on the conversion thread (``timeline.py``) and sent as metrics
(``capture/metrics/window_metrics.py``) and one span per step and device (``spans.py``)."""
