"""pqlib.py — a small binding of libpq (through ctypes) for the scenario tests that need what psql
cannot show: when each row of a streaming query arrives, and NOTIFY messages as they come.

Only the Python standard library and libpq.so.5 (which psql itself uses) are needed.  Connection
settings come from the environment (PGHOST, PGPORT, PGUSER), as for psql.  libpq calls release the
GIL, so connections in different threads wait in parallel.
"""
import ctypes
import ctypes.util
import os
import select
import time

_lib = ctypes.CDLL(ctypes.util.find_library("pq") or "libpq.so.5")


class _PGnotify(ctypes.Structure):
    _fields_ = [("relname", ctypes.c_char_p), ("be_pid", ctypes.c_int), ("extra", ctypes.c_char_p)]


_lib.PQconnectdb.argtypes = [ctypes.c_char_p]
_lib.PQconnectdb.restype = ctypes.c_void_p
_lib.PQstatus.argtypes = [ctypes.c_void_p]
_lib.PQerrorMessage.argtypes = [ctypes.c_void_p]
_lib.PQerrorMessage.restype = ctypes.c_char_p
_lib.PQfinish.argtypes = [ctypes.c_void_p]
_lib.PQexec.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_lib.PQexec.restype = ctypes.c_void_p
_lib.PQresultStatus.argtypes = [ctypes.c_void_p]
_lib.PQresultErrorMessage.argtypes = [ctypes.c_void_p]
_lib.PQresultErrorMessage.restype = ctypes.c_char_p
_lib.PQresultErrorField.argtypes = [ctypes.c_void_p, ctypes.c_int]
_lib.PQresultErrorField.restype = ctypes.c_char_p
_lib.PQntuples.argtypes = [ctypes.c_void_p]
_lib.PQnfields.argtypes = [ctypes.c_void_p]
_lib.PQgetvalue.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
_lib.PQgetvalue.restype = ctypes.c_char_p
_lib.PQgetisnull.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
_lib.PQclear.argtypes = [ctypes.c_void_p]
_lib.PQsocket.argtypes = [ctypes.c_void_p]
_lib.PQconsumeInput.argtypes = [ctypes.c_void_p]
_lib.PQnotifies.argtypes = [ctypes.c_void_p]
_lib.PQnotifies.restype = ctypes.POINTER(_PGnotify)
_lib.PQfreemem.argtypes = [ctypes.c_void_p]
_lib.PQsendQuery.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_lib.PQsendQueryParams.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_void_p,
                                   ctypes.POINTER(ctypes.c_char_p), ctypes.c_void_p, ctypes.c_void_p,
                                   ctypes.c_int]
_lib.PQsetSingleRowMode.argtypes = [ctypes.c_void_p]
_lib.PQgetResult.argtypes = [ctypes.c_void_p]
_lib.PQgetResult.restype = ctypes.c_void_p

_CONNECTION_OK = 0
_PGRES_COMMAND_OK = 1
_PGRES_TUPLES_OK = 2
_PGRES_SINGLE_TUPLE = 9
_PG_DIAG_SQLSTATE = ord("C")


class PqError(Exception):
    def __init__(self, message, sqlstate=None):
        Exception.__init__(self, message)
        self.sqlstate = sqlstate


class Conn:
    """One connection; exec() runs a query and returns its rows as tuples of str (None for NULL)."""

    def __init__(self, db, app="cai_scenario_pq", env=None):
        parts = ["dbname=%s" % db, "application_name=%s" % app]
        for key, word in (("PGHOST", "host"), ("PGPORT", "port"), ("PGUSER", "user")):
            value = (env or {}).get(key) or os.environ.get(key)
            if value:
                parts.append("%s=%s" % (word, value))
        self.conn = _lib.PQconnectdb(" ".join(parts).encode())
        if _lib.PQstatus(self.conn) != _CONNECTION_OK:
            message = _lib.PQerrorMessage(self.conn).decode(errors="replace")
            _lib.PQfinish(self.conn)
            self.conn = None
            raise PqError("connection failed: " + message.strip())

    def exec(self, sql):
        res = _lib.PQexec(self.conn, sql.encode())
        if not res:
            raise PqError(_lib.PQerrorMessage(self.conn).decode(errors="replace").strip())
        try:
            status = _lib.PQresultStatus(res)
            if status not in (_PGRES_COMMAND_OK, _PGRES_TUPLES_OK):
                state = _lib.PQresultErrorField(res, _PG_DIAG_SQLSTATE)
                raise PqError(_lib.PQresultErrorMessage(res).decode(errors="replace").strip(),
                              state.decode() if state else None)
            rows = []
            for r in range(_lib.PQntuples(res)):
                row = []
                for c in range(_lib.PQnfields(res)):
                    if _lib.PQgetisnull(res, r, c):
                        row.append(None)
                    else:
                        row.append(_lib.PQgetvalue(res, r, c).decode(errors="replace"))
                rows.append(tuple(row))
            return rows
        finally:
            _lib.PQclear(res)

    def value(self, sql):
        rows = self.exec(sql)
        return rows[0][0] if rows else None

    def notifies(self, timeout):
        """Waits up to timeout seconds for notifications; returns [(channel, payload, pid)]."""
        deadline = time.monotonic() + timeout
        got = []
        while True:
            _lib.PQconsumeInput(self.conn)
            while True:
                n = _lib.PQnotifies(self.conn)
                if not n:
                    break
                got.append((n.contents.relname.decode(), n.contents.extra.decode(), n.contents.be_pid))
                _lib.PQfreemem(ctypes.cast(n, ctypes.c_void_p))
            left = deadline - time.monotonic()
            if got or left <= 0:
                return got
            select.select([_lib.PQsocket(self.conn)], [], [], left)

    def stream_rows(self, query, on_row=None, stop=None):
        """Runs a query through a cursor, one FETCH per row, and returns [(monotonic time, value)]
        as each row arrives: a set-returning function called in the select list hands each row
        over as soon as it produces it.  Stops early (rolling back) when stop() turns true."""
        arrivals = []
        self.exec("BEGIN")
        try:
            self.exec("DECLARE pqlib_stream NO SCROLL CURSOR FOR " + query)
            while stop is None or not stop():
                rows = self.exec("FETCH 1 FROM pqlib_stream")
                if not rows:
                    break
                arrivals.append((time.monotonic(), rows[0][0]))
                if on_row:
                    on_row(len(arrivals))
        finally:
            self.exec("ROLLBACK")
        return arrivals

    def single_rows(self, query, params=None):
        """Runs a query in libpq's single-row mode, through the simple protocol, or the extended one
        when params (a list of str) are given, and returns [(time.time(), row)] as each row
        arrives: no cursor, the way drivers stream (psycopg's cursor.stream, JDBC's fetch size
        on a plain query)."""
        if params is None:
            sent = _lib.PQsendQuery(self.conn, query.encode())
        else:
            values = (ctypes.c_char_p * len(params))(*[p.encode() for p in params])
            sent = _lib.PQsendQueryParams(self.conn, query.encode(), len(params), None, values,
                                          None, None, 0)
        if not sent:
            raise PqError(_lib.PQerrorMessage(self.conn).decode(errors="replace").strip())
        _lib.PQsetSingleRowMode(self.conn)
        arrivals = []
        error = None
        while True:
            res = _lib.PQgetResult(self.conn)
            if not res:
                break
            status = _lib.PQresultStatus(res)
            if status == _PGRES_SINGLE_TUPLE:
                row = tuple(None if _lib.PQgetisnull(res, 0, c) else
                            _lib.PQgetvalue(res, 0, c).decode(errors="replace")
                            for c in range(_lib.PQnfields(res)))
                arrivals.append((time.time(), row))
            elif status not in (_PGRES_COMMAND_OK, _PGRES_TUPLES_OK) and error is None:
                state = _lib.PQresultErrorField(res, _PG_DIAG_SQLSTATE)
                error = PqError(_lib.PQresultErrorMessage(res).decode(errors="replace").strip(),
                                state.decode() if state else None)
            _lib.PQclear(res)
        if error:
            raise error
        return arrivals

    def close(self):
        if self.conn:
            _lib.PQfinish(self.conn)
            self.conn = None
