"""A sweep's report: tables, figures, report.html, the per-configuration MLflow runs. `python -m sweeplab.report`."""
