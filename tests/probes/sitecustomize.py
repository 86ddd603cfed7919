"""Started by Python in a test's child process (the test puts this folder on PYTHONPATH):

- SWEEPLAB_TEST_MODULES_AT_EXIT: when the child exits, the names of the modules it imported go to that file (`{pid}`
  in the name becomes the process's id: a sweep's workers each write their own), so a test can see whether a
  refusal came before torch and Lightning were imported, or what a sweeper's main process imported;
- SWEEPLAB_TEST_QUERIES: every SQL statement the process sends to a database (the MLflow store's sqlite) is appended
  to that file as `<pid> <time.time()> <statement's first word>`, through SQLAlchemy's own event hook on every engine."""

import atexit
import os
import sys
import time

_OUT = os.environ.get("SWEEPLAB_TEST_MODULES_AT_EXIT")
if _OUT:
    _OUT = _OUT.replace("{pid}", str(os.getpid()))
    atexit.register(lambda: open(_OUT, "w").write("\n".join(sorted(sys.modules))))

_QUERIES = os.environ.get("SWEEPLAB_TEST_QUERIES")
if _QUERIES:
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    @event.listens_for(Engine, "before_cursor_execute")
    def _log_statement(conn, cursor, statement, parameters, context, executemany):
        with open(_QUERIES, "a") as log:
            log.write(f"{os.getpid()} {time.time()} {statement.split(None, 1)[0].upper()}\n")
