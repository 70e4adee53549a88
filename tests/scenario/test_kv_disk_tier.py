"""The prefix cache's disk tier: a conversation's turn is cached and written to the tier (files
0600 in a 0700 directory inside the data directory, under a name pg_basebackup skips); the engine
process is killed with SIGKILL; the follow-up, on the new engine, reuses the prompt from disk
(usage's cached_tokens, pg_stat_cai's disk_hits) and replies exactly as a cold, cache-less run of
the same conversation does (greedy).  cai_forget(conversation) removes the conversation's files
and memory blocks (the same prompt is then a miss), and cai_cache_reset() removes every file.  On
a cluster of its own, the blocks also outlive a restart of the whole server."""
import os
import shutil
import signal
import stat as st
import subprocess
import tempfile

from pgtest import Checks, Cluster, as_postgres, ensure_database, psql, stat, value, wait_for

c = Checks()
ensure_database()

GREEDY = '{"temperature": 0, "max_tokens": 24}'
NONCE = os.urandom(4).hex()
SYSTEM = ("You are the archivist of the museum of maritime history (collection %s). You answer "
          "questions about ships, harbours, navigation instruments and the people who sailed. "
          "Keep answers short, factual and polite; say when you do not know. " % NONCE) * 3
FIRST = ("I found a brass instrument in my grandfather's attic. It has a graduated arc of about "
         "sixty degrees, a movable arm with a mirror, a small telescope and two sets of coloured "
         "shade glasses. What is it, and how was it used at sea?")
FOLLOW = "And how accurate could a navigator be with it?"

data_dir = value("SHOW data_directory")
tier_root = os.path.join(data_dir, value("SHOW pg_cai.disk_cache_dir"))


def tier_files():
    """The tier's block files (all models' subdirectories)."""
    out = []
    if not os.path.isdir(tier_root):
        return out
    for sub in os.listdir(tier_root):
        path = os.path.join(tier_root, sub)
        if os.path.isdir(path):
            out += [os.path.join(path, f) for f in os.listdir(path) if f.endswith(".kv")]
    return out


def last_assistant(conv):
    """(content, prompt_tokens, cached_tokens) of the conversation's latest reply."""
    row = value("SELECT content || chr(1) || prompt_tokens || chr(1) || cached_tokens "
                "FROM cai.messages WHERE conversation_id = %d AND role = 'assistant' "
                "ORDER BY id DESC LIMIT 1" % conv)
    content, prompt, cached = row.split("\x01")
    return content, int(prompt), int(cached)


def chat(conv, message):
    return value("SELECT cai_chat(%d, $m$%s$m$, '%s')" % (conv, message, GREEDY))


c.check("the tier is on by default, with its budget in pg_stat_cai",
        int(stat("disk_budget_bytes")) > 0, stat("disk_budget_bytes"))
c.check("the tier's directory is named so that pg_basebackup skips it",
        os.path.basename(tier_root).startswith("pgsql_tmp"), tier_root)
value("SELECT cai_cache_reset()")

# ---- a turn, written to disk off the request's path ------------------------------------------
conv = int(value("SELECT cai_new_conversation($s$%s$s$)" % SYSTEM))
chat(conv, FIRST)
_, prompt1, _ = last_assistant(conv)
c.check("the first turn's prompt spans several blocks", prompt1 >= 128, str(prompt1))
written = wait_for(lambda: len(tier_files()) >= prompt1 // 16, 60, 0.1)
files = tier_files()
c.check("the turn's full blocks reach the disk", written is not None,
        "%d files for %d prompt tokens" % (len(files), prompt1))
c.check("block files are 0600 in a 0700 directory owned by the server",
        files != [] and all(st.S_IMODE(os.stat(f).st_mode) == 0o600 for f in files) and
        st.S_IMODE(os.stat(os.path.dirname(files[0])).st_mode) == 0o700 and
        os.stat(os.path.dirname(files[0])).st_uid == os.stat(data_dir).st_uid,
        repr([oct(os.stat(f).st_mode) for f in files[:2]]))

# ---- a base backup leaves the tier out ------------------------------------------------------------
backup_dir = tempfile.mkdtemp(prefix="pg_cai_backup.")
os.chmod(backup_dir, 0o777)
bindir = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True).stdout.strip()
r = subprocess.run(as_postgres([os.path.join(bindir, "pg_basebackup"), "-D",
                                os.path.join(backup_dir, "data"), "-X", "none", "-c", "fast"]),
                   capture_output=True, text=True)
c.check("pg_basebackup copies the data directory but not the tier",
        r.returncode == 0 and os.path.isfile(os.path.join(backup_dir, "data", "PG_VERSION")) and
        not os.path.exists(os.path.join(backup_dir, "data", os.path.basename(tier_root))),
        r.stderr[-300:])
shutil.rmtree(backup_dir, ignore_errors=True)

# ---- kill -9: the next engine finds the blocks on disk -----------------------------------------
engine_pid = int(stat("engine_pid"))
os.kill(engine_pid, signal.SIGKILL)
back = wait_for(lambda: stat("status") == "ready" and stat("engine_pid") not in ("", str(engine_pid)),
                120, 0.1)
c.check("a new engine process serves after SIGKILL", back is not None, stat("status"))
c.check("the new engine starts with an empty memory cache", stat("cache_blocks") == "0",
        stat("cache_blocks"))
reply_disk = chat(conv, FOLLOW)
_, prompt2, cached2 = last_assistant(conv)
c.check("the follow-up reuses the first turn's blocks, read back from disk",
        cached2 >= (prompt1 // 16) * 16 and cached2 < prompt2, "%d of %d (first prompt %d)"
        % (cached2, prompt2, prompt1))
hits = wait_for(lambda: int(stat("disk_hits")) > 0 and int(stat("disk_hit_tokens")) >= cached2 - 15,
                10, 0.1)
c.check("pg_stat_cai counts the disk hits and the bytes read",
        hits is not None and int(stat("disk_bytes_read")) > 0,
        stat("disk_hits || ' ' || disk_hit_tokens || ' ' || disk_bytes_read"))

# ---- cai_forget: the conversation's files and memory blocks go --------------------------------
wait_for(lambda: len(tier_files()) >= (prompt2 + 1) // 16, 30, 0.1)
before = len(tier_files())
value("SELECT cai_forget(%d)" % conv)
c.check("cai_forget removes the conversation's files", before > 0 and tier_files() == [],
        "%d before, %d after" % (before, len(tier_files())))
c.check("cai_forget of a conversation that does not exist is an error",
        psql("SELECT cai_forget(-1)").rc != 0, "")

# the same first turn in another conversation now misses: nothing of the first one is left
conv2 = int(value("SELECT cai_new_conversation($s$%s$s$)" % SYSTEM))
chat(conv2, FIRST)
_, _, cached_again = last_assistant(conv2)
c.check("after cai_forget the same prompt is computed again", cached_again == 0, str(cached_again))

# ---- the disk reply equals a cold one; cai_cache_reset removes every file ----------------------
value("SELECT cai_cache_reset()")
c.check("cai_cache_reset removes every file", tier_files() == [], str(len(tier_files())))
reply_cold = chat(conv2, FOLLOW)
_, _, cached_cold = last_assistant(conv2)
c.check("the cold follow-up used no cache", cached_cold == 0, str(cached_cold))
c.check("the reply served from disk is the cold reply, token for token",
        reply_disk == reply_cold, "%r vs %r" % (reply_disk, reply_cold))
wait_for(lambda: len(tier_files()) > 0, 30, 0.1)
value("SELECT cai_cache_reset()")
c.check("cai_cache_reset removes the files written since", tier_files() == [],
        str(len(tier_files())))

# ---- a restart of the server: the next follow-up is served from disk ------------------------
own = Cluster({"shared_preload_libraries": "'pg_cai'",
               "pg_cai.model": "'%s'" % os.environ["PG_CAI_TEST_MODEL"],
               "pg_cai.threads": "2", "pg_cai.context_length": "1024"})
try:
    own.start()
    own.wait_log("pg_cai engine worker ready", 120)

    def own_value(sql):
        r = own.psql(sql)
        return r.out if r.rc == 0 else None

    own_value("CREATE EXTENSION pg_cai")
    oconv = int(own_value("SELECT cai_new_conversation($s$%s$s$)" % SYSTEM))
    own_value("SELECT cai_chat(%d, $m$%s$m$, '%s')" % (oconv, FIRST, GREEDY))
    wait_for(lambda: int(own_value("SELECT disk_files FROM pg_stat_cai") or 0) >= 8, 60, 0.2)
    before = int(own_value("SELECT disk_files FROM pg_stat_cai") or 0)
    own.stop()
    with open(own.log) as f:
        log_size = len(f.read())
    own.start()
    ready = wait_for(lambda: "pg_cai engine worker ready" in open(own.log).read()[log_size:], 120, 0.2)
    own_value("SELECT cai_chat(%d, $m$%s$m$, '%s')" % (oconv, FOLLOW, GREEDY))
    usage = own_value("SELECT prompt_tokens || ' ' || cached_tokens FROM cai.messages WHERE "
                      "conversation_id = %d AND role = 'assistant' ORDER BY id DESC LIMIT 1"
                      % oconv)
    cached = int(usage.split()[1]) if usage else 0
    c.check("after a restart of the server the follow-up is served from disk",
            ready is not None and before >= 8 and cached >= before * 16,
            "%d files before the restart; usage %s" % (before, usage))
finally:
    own.stop()
    own.remove()
c.done()
