"""Live capture: step boundaries and phases (steps.py) from torch hooks (hooks.py), the job's
identity (identity.py), step metrics (step_metrics.py) and step spans (step_spans.py)."""
