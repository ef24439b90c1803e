"""What the commands report: ``summary`` (torch's ``key_averages`` table from a trace or a
spool) and ``doctor`` (the configuration and connectivity checks)."""
