"""Profiling windows: when torch.profiler records and how its traces are converted and shipped
(``profiling``), with the live session's resource on their requests (``resource``)."""
