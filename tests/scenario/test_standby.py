"""A hot standby made with pg_basebackup -R from a primary with pg_cai: the base backup carries
no weights cache file (the default pg_cai.weights_cache is under a name base backups leave out),
the standby's own engine serves the functions that only read (cai_complete, cai_tokenize), and
the functions that store turns (cai_chat, cai_chat_stream, cai_new_conversation) fail at once
with SQLSTATE 25006, naming themselves and pointing at the primary.

Two clusters of their own, with small settings; PG_CAI_TEST_MODEL (run-tests.sh) is the model."""
import os
import shutil
import subprocess

from pgtest import Checks, Cluster, as_postgres, wait_for

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = os.environ.get("PG_CAI_TEST_MODEL") or os.path.join(ROOT, "models",
                                                            "SmolLM2-135M-Instruct.Q4_1.gguf")
SETTINGS = {"shared_preload_libraries": "'pg_cai'", "pg_cai.model": "'%s'" % MODEL,
            "pg_cai.threads": "1", "pg_cai.context_length": "512",
            "pg_cai.host_cache_size": "16"}
READY = "pg_cai engine worker ready"
c = Checks()


def log_of(cluster):
    with open(cluster.log, errors="replace") as f:
        return f.read()


def wait_ready(cluster):
    """Waits for the engine; when it converted the weights, until it has written its cache."""
    wait_for(lambda: READY in log_of(cluster), 180, 0.2)
    if "caching to" in log_of(cluster):
        wait_for(lambda: "cached to" in log_of(cluster), 180, 0.2)
    return READY in log_of(cluster)


def files_under(top):
    found = []
    for parent, _dirs, names in os.walk(top):
        found += [os.path.join(parent, n) for n in names]
    return found


primary = Cluster(SETTINGS)
standby = None
try:
    c.check("the primary starts", primary.start(), primary.log)
    c.check("the primary's engine is ready", wait_ready(primary), log_of(primary)[-2000:])
    r = primary.psql("CREATE EXTENSION pg_cai;"
                     " SELECT cai_new_conversation('You are brief.', '{\"max_tokens\": 2}') AS id \\gset\n"
                     " SELECT cai_chat(:id, 'Hello!') <> ''; SELECT :id")
    conv = r.out.splitlines()[-1] if r.rc == 0 else "0"
    c.check("the primary stores a conversation", r.rc == 0 and conv.isdigit(), repr(r))
    cache = [f for f in files_under(primary.data) if f.endswith(".caiw")]
    c.check("the primary keeps its weights cache in its data directory", len(cache) == 1,
            "%r" % cache)

    # ---- the base backup ----------------------------------------------------------------------
    standby = Cluster(SETTINGS)
    shutil.rmtree(standby.data)
    p = subprocess.run(as_postgres([os.path.join(primary.bindir, "pg_basebackup"), "-h", primary.dir,
                                    "-p", str(primary.port), "-U", "postgres", "-D", standby.data,
                                    "-R", "-X", "stream", "--no-sync"]),
                       capture_output=True, text=True, timeout=300)
    c.check("pg_basebackup -R succeeds", p.returncode == 0, p.stderr)
    names = {os.path.basename(f) for f in cache}
    copied = [f for f in files_under(standby.data)
              if os.path.basename(f) in names or f.endswith(".caiw")]
    c.check("the base backup carries no weights cache file", cache and not copied,
            "copied: %r" % copied)

    # ---- the standby ----------------------------------------------------------------------------
    standby.configure(SETTINGS)
    c.check("the standby starts", standby.start(), standby.log)
    c.check("the standby's own engine is ready", wait_ready(standby), log_of(standby)[-2000:])
    r = standby.psql("SELECT pg_is_in_recovery(); SELECT count(*) FROM cai.messages")
    c.check("the standby is in recovery and sees the primary's turns",
            r.rc == 0 and r.out.splitlines() == ["t", "2"], repr(r))
    r = standby.psql("SELECT cai_complete('The capital of France is', '{\"max_tokens\": 3}') <> ''")
    c.check("cai_complete works on the standby", r.rc == 0 and r.out == "t", repr(r))
    r = standby.psql("SELECT cardinality(cai_tokenize('Hello, world')) > 0")
    c.check("cai_tokenize works on the standby", r.rc == 0 and r.out == "t", repr(r))

    for call, name in (("cai_chat(%s, 'Hi')" % conv, "cai_chat"),
                       ("cai_chat_stream(%s, 'Hi')" % conv, "cai_chat_stream"),
                       ("cai_new_conversation()", "cai_new_conversation"),
                       ("cai_set_partition(3)", "cai_set_partition")):
        r = standby.psql("\\set VERBOSITY verbose\nSELECT %s" % call)
        c.check("%s fails on the standby with 25006, naming itself" % name,
                r.rc != 0 and ("ERROR:  25006: cannot execute %s on a hot standby" % name) in r.err,
                repr(r))
        c.check("%s's error says to call it on the primary" % name,
                "HINT:  Call it on the primary" in r.err, repr(r))
    # cai_forget stores nothing: the standby checks that the conversation exists, locking nothing
    r = standby.psql("SELECT cai_forget(%s)" % conv)
    c.check("cai_forget works on the standby", r.rc == 0, repr(r))
    r = standby.psql("SELECT cai_cache_reset()")
    c.check("cai_cache_reset works on the standby", r.rc == 0, repr(r))
    r = standby.psql("\\set VERBOSITY verbose\nSELECT cai_forget(%s + 1000)" % conv)
    c.check("cai_forget of a missing conversation on the standby says it does not exist (42704)",
            r.rc != 0 and "ERROR:  42704: conversation" in r.err and "does not exist" in r.err,
            repr(r))
finally:
    for cluster in (standby, primary):
        if cluster is not None:
            cluster.stop()
    if c.failed == 0:
        for cluster in (standby, primary):
            if cluster is not None:
                cluster.remove()
    else:
        print("kept %s and %s" % (primary.dir, standby.dir if standby else "-"))
c.done()
