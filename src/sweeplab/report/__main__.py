"""`python -m sweeplab.report`: the report of a sweep (or of an experiment's runs)."""

from sweeplab.report.tables import main

if __name__ == "__main__":
    raise SystemExit(main())
