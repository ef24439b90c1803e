"""Benchmarks: run each as a script (python benchmarks/NAME.py); see its docstring."""
