"""`python -m sweeplab.report`: the report of a sweep (or of an experiment's runs)."""

from sweeplab.core.interrupts import exit_on_interrupt

if __name__ == "__main__":
    with exit_on_interrupt("report"):  # before the imports: Ctrl-C in the first seconds is one line too
        from sweeplab.report.tables import main

        status = main()
    raise SystemExit(status)
