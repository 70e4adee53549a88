"""pgtest.py — helpers for pg_cai's scenario tests: psql sessions, checks, throwaway clusters.

Only the Python standard library and the PostgreSQL client programs are used.  Connection
settings come from the environment that scripts/run-tests.sh exports (PGHOST, PGPORT, PGUSER).
Every check prints one line, "PASS name" or "FAIL name: why", which run-tests.sh counts.
"""
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

DB = "cai_scenario"
LONG_PROMPT = "Count from 1 to 1000, separated by commas: 1, 2, 3,"
LONG_OPTIONS = '{"max_tokens": 1500, "ignore_eos": true}'


class Result:
    """What one psql invocation did."""

    def __init__(self, rc, out, err, ms):
        self.rc, self.out, self.err, self.ms = rc, out, err, ms

    def __repr__(self):
        return "rc=%d out=%r err=%r (%.0f ms)" % (self.rc, self.out[-300:], self.err[-300:], self.ms)


def psql(sql, db=DB, timeout=300, env=None, app="cai_scenario"):
    """Runs a psql script in one session; returns a Result (rc 0 = success)."""
    e = dict(os.environ)
    e["PGAPPNAME"] = app
    if env:
        e.update(env)
    # through stdin, so that statements run one by one and psql's backslash commands work
    cmd = ["psql", "-X", "-A", "-t", "-q", "-v", "ON_ERROR_STOP=1", "-d", db, "-f", "-"]
    start = time.monotonic()
    try:
        p = subprocess.run(cmd, input=sql, capture_output=True, text=True, timeout=timeout, env=e)
        rc, out, err = p.returncode, p.stdout.strip(), p.stderr.strip()
    except subprocess.TimeoutExpired:
        rc, out, err = -1, "", "timed out after %d s" % timeout
    return Result(rc, out, err, (time.monotonic() - start) * 1000.0)


def value(sql, db=DB, **kw):
    """The single value a query returns; raises when the query fails."""
    r = psql(sql, db=db, **kw)
    if r.rc != 0:
        raise RuntimeError("query failed: %s: %r" % (sql, r))
    return r.out


def in_background(sql, db=DB, app="cai_scenario_bg", env=None, timeout=300):
    """Starts psql in a thread; returns (thread, holder) where holder[0] gets the Result."""
    holder = [None]

    def run():
        holder[0] = psql(sql, db=db, app=app, env=env, timeout=timeout)

    t = threading.Thread(target=run)
    t.start()
    return t, holder


def wait_for(predicate, timeout, interval=0.1):
    """Polls predicate until it returns a true value or timeout seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            v = predicate()
            if v:
                return v
        except Exception:
            pass
        time.sleep(interval)
    return None


def backend_pid(app, db=DB):
    """The pid of the session running with application_name app and an active query."""
    out = value("SELECT pid FROM pg_stat_activity WHERE application_name = '%s' "
                "AND state = 'active' LIMIT 1" % app, db="postgres")
    return int(out) if out else None


def worker_pid(db=DB):
    out = value("SELECT worker_pid FROM pg_stat_cai", db=db)
    return int(out) if out else None


def worker_ready(db=DB):
    r = psql("SELECT status FROM pg_stat_cai", db=db)
    return r.rc == 0 and r.out == "ready"


def stat(column, db=DB):
    """One column of pg_stat_cai, as text."""
    return value("SELECT %s FROM pg_stat_cai" % column, db=db)


def log_text():
    """The test cluster's server log so far ($PG_CAI_TEST_LOG, set by scripts/run-tests.sh)."""
    with open(os.environ["PG_CAI_TEST_LOG"], errors="replace") as f:
        return f.read()


def ensure_database(db=DB):
    """Creates the scenario database with pg_cai in it, once."""
    exists = value("SELECT count(*) FROM pg_database WHERE datname = '%s'" % db, db="postgres")
    if exists == "0":
        value("CREATE DATABASE %s" % db, db="postgres")
        value("CREATE EXTENSION pg_cai", db=db)


class Checks:
    """Counts PASS/FAIL lines."""

    def __init__(self):
        self.failed = 0

    def check(self, name, ok, why=""):
        if ok:
            print("PASS %s" % name, flush=True)
        else:
            self.failed += 1
            print("FAIL %s: %s" % (name, why), flush=True)
        return ok

    def done(self):
        sys.exit(1 if self.failed else 0)


def as_postgres(cmd):
    """The command, run as the postgres OS user when we are root."""
    if os.geteuid() == 0:
        return ["runuser", "-u", "postgres", "--"] + cmd
    return cmd


# One int8 digit, nearest rounding, as scripts/lib-cluster.sh gives the shared test cluster: the
# numerics the expected replies were written with (the defaults are checked by test_reload.py).
TEST_NUMERICS = {"pg_cai.weight_rounding": "nearest", "pg_cai.activation_precision": "int8"}


class Cluster:
    """A throwaway cluster of its own (for settings the shared test cluster must not have)."""

    def __init__(self, settings):
        self.bindir = subprocess.run(["pg_config", "--bindir"], capture_output=True,
                                     text=True).stdout.strip()
        self.dir = tempfile.mkdtemp(prefix="pg_cai_test.")
        os.chmod(self.dir, 0o755)
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres", "postgres")
        self.data = os.path.join(self.dir, "data")
        self.log = os.path.join(self.dir, "server.log")
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        self.port = s.getsockname()[1]
        s.close()
        subprocess.run(as_postgres([os.path.join(self.bindir, "initdb"), "-D", self.data,
                                    "-A", "trust", "-U", "postgres", "--no-sync"]),
                       check=True, capture_output=True)
        self.configure(settings)

    def configure(self, settings):
        """Rewrites the settings this harness appends to postgresql.conf."""
        conf = os.path.join(self.data, "postgresql.conf")
        with open(conf) as f:
            base = f.read().split("# --- pg_cai scenario ---")[0]
        lines = ["# --- pg_cai scenario ---",
                 "port = %d" % self.port,
                 "listen_addresses = ''",
                 "unix_socket_directories = '%s'" % self.dir,
                 "max_connections = 20",
                 "lc_messages = 'C'"]
        lines += ["%s = %s" % kv for kv in dict(TEST_NUMERICS, **settings).items()]
        with open(conf, "w") as f:
            f.write(base + "\n".join(lines) + "\n")

    def env(self):
        return {"PGHOST": self.dir, "PGPORT": str(self.port), "PGUSER": "postgres"}

    def pg_ctl(self, *args):
        return subprocess.run(as_postgres([os.path.join(self.bindir, "pg_ctl"), "-D", self.data,
                                           "-l", self.log, "-w"] + list(args)),
                              capture_output=True, text=True)

    def start(self):
        return self.pg_ctl("start").returncode == 0

    def stop(self):
        self.pg_ctl("-m", "fast", "stop")

    def psql(self, sql, db="postgres", **kw):
        return psql(sql, db=db, env=self.env(), **kw)

    def wait_log(self, text, timeout=60):
        def seen():
            with open(self.log, errors="replace") as f:
                return text in f.read()
        return wait_for(seen, timeout, 0.2)

    def remove(self):
        shutil.rmtree(self.dir, ignore_errors=True)
