"""Step spans: one span per step with a child per phase, queued and encoded off the training
thread (``step_spans``)."""
