"""Seeded, bounded random SQL: random messages (emoji, combining marks, right-to-left text,
control characters, special-token text, long lines) with random valid options (multi-byte stop
strings, max_tokens, seeds, temperatures, top_p, top_k) through cai_chat, cai_chat_stream,
cai_complete, the synchronous reply trigger and the asynchronous one, four sessions at a time.
Asserts that the engine process never restarted, that every call returned text or a clear error
(never an internal error or a lost connection), and that every committed turn is stored as
returned.  PG_CAI_RANDOM_SEED picks another seed; PG_CAI_RANDOM_CALLS the calls per session."""
import json
import os
import random
import threading
import time

from pgtest import Checks, ensure_database, value, wait_for
from pqlib import Conn, PqError

SEED = int(os.environ.get("PG_CAI_RANDOM_SEED", "20261124"))
CALLS = int(os.environ.get("PG_CAI_RANDOM_CALLS", "25"))
SESSIONS = 4
print("seed %d, %d sessions x %d calls per phase" % (SEED, SESSIONS, CALLS))

PIECES = [
    "hello", "world", " ", "\u00e9t\u00e9", "e\u0301", "n\u0303", "\U0001F600", "\U0001F469\u200D\U0001F4BB",
    "\U0001F44B\U0001F3FD", "\u05e9\u05dc\u05d5\u05dd", "\u0645\u0631\u062d\u0628\u0627", "\u202eabc\u202c",
    "\u65e5\u672c\u8a9e", "\t", "\n", "\x01", "\x1b[31m", "\x7f", "<|im_start|>", "<|im_end|>",
    "<|endoftext|>", "user\n", "\u200b", "\ufeff", "'", "\\", "$$", "%s", "{\"a\": 1}", "42",
]
STOPS = ["\U0001F600", "\u00e9", " the", "\n", "\u05dd", "zzz", ".", "\U0001F469", "ing", "!"]


def random_message(rng):
    if rng.random() < 0.1:
        return "word " * rng.randint(100, 300)      # a long line
    text = "".join(rng.choice(PIECES) for _ in range(rng.randint(1, 12)))
    return text if text.strip() else text + "hi"


def random_options(rng):
    opts = {"max_tokens": rng.randint(1, 24), "seed": rng.randint(0, 2**31)}
    if rng.random() < 0.6:
        opts["temperature"] = round(rng.uniform(0, 1.5), 3)
    if rng.random() < 0.3:
        opts["top_p"] = round(rng.uniform(0.05, 1.0), 3)
    if rng.random() < 0.3:
        opts["top_k"] = rng.randint(0, 50)
    if rng.random() < 0.6:
        opts["stop"] = rng.sample(STOPS, rng.randint(1, 3))
    if rng.random() < 0.2:
        opts["ignore_eos"] = True
    return opts


def quote(text):
    return "'" + text.replace("'", "''") + "'"


def clear_error(e):
    """A clear error: a SQLSTATE that is not an internal error, and a message."""
    return e.sqlstate is not None and e.sqlstate not in ("XX000", "58000") and len(str(e)) > 0


c = Checks()
ensure_database()
starts_before = value("SELECT engine_starts FROM pg_stat_cai")
problems = []
outcomes = {}
lock = threading.Lock()


def note(problem):
    with lock:
        problems.append(problem)


def count(outcome):
    with lock:
        outcomes[outcome] = outcomes.get(outcome, 0) + 1


def run_session(index, phase):
    rng = random.Random("%d/%s/%d" % (SEED, phase, index))
    conn = Conn("cai_scenario", "cai_random_%s_%d" % (phase, index))
    try:
        for n in range(CALLS):
            msg = random_message(rng)
            opts = json.dumps(random_options(rng), ensure_ascii=False)
            where = "%s session %d call %d (%r, %s)" % (phase, index, n, msg[:40], opts)
            try:
                if phase == "functions":
                    kind = rng.choice(["chat", "stream", "complete"])
                    conv = conn.value("SELECT cai_new_conversation()")
                    if kind == "chat":
                        reply = conn.value("SELECT cai_chat(%s, %s, %s)" % (conv, quote(msg), quote(opts)))
                    elif kind == "stream":
                        rows = conn.exec("SELECT cai_chat_stream(%s, %s, %s)" % (conv, quote(msg), quote(opts)))
                        reply = "".join(r[0] for r in rows)
                    else:
                        reply = conn.value("SELECT cai_complete(%s, %s)" % (quote(msg), quote(opts)))
                    if reply is None:
                        note("%s: %s returned NULL" % (where, kind))
                    if kind != "complete":
                        stored = conn.exec("SELECT role, content FROM cai.messages "
                                           "WHERE conversation_id = %s ORDER BY id" % conv)
                        if stored != [("user", msg), ("assistant", reply)]:
                            note("%s: %s stored %r, returned %r" % (where, kind, stored, reply))
                else:
                    conv = conn.value("SELECT cai_new_conversation(NULL, %s)" % quote(opts))
                    conn.exec("INSERT INTO cai.messages (conversation_id, role, content) "
                              "VALUES (%s, 'user', %s)" % (conv, quote(msg)))
                    with lock:
                        conversations.append((conv, msg, where))
                count("ok")
            except PqError as e:
                count(e.sqlstate)
                if not clear_error(e):
                    note("%s: not a clear error: %s %s" % (where, e.sqlstate, e))
    except PqError as e:
        note("%s session %d lost its connection: %s" % (phase, index, e))
    finally:
        conn.close()


def run_phase(phase):
    threads = [threading.Thread(target=run_session, args=(i, phase)) for i in range(SESSIONS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)


def replies_stored(convs):
    """Every conversation holds its user turn and exactly one assistant turn after it."""
    bad = []
    for conv, msg, where in convs:
        rows = value("SELECT string_agg(role, ',' ORDER BY id) FROM cai.messages WHERE conversation_id = %s" % conv)
        if rows != "user,assistant":
            bad.append("%s: turns %s" % (where, rows))
    return bad


start = time.monotonic()
run_phase("functions")

# the synchronous reply trigger answers each inserted user turn in the inserting transaction
conversations = []
value("DROP TRIGGER IF EXISTS random_reply_now ON cai.messages")
value("CREATE TRIGGER random_reply_now AFTER INSERT ON cai.messages FOR EACH ROW "
      "EXECUTE FUNCTION cai_reply_trigger()")
try:
    run_phase("sync_trigger")
finally:
    value("DROP TRIGGER random_reply_now ON cai.messages")
problems.extend(replies_stored(conversations))

# the asynchronous one queues a job answered after commit
conversations = []
value("DROP TRIGGER IF EXISTS random_reply_later ON cai.messages")
value("CREATE TRIGGER random_reply_later AFTER INSERT ON cai.messages FOR EACH ROW "
      "EXECUTE FUNCTION cai_enqueue_reply_trigger()")
try:
    run_phase("async_trigger")
    ids = ",".join(str(conv) for conv, _, _ in conversations) or "0"
    settled = wait_for(lambda: value("SELECT count(*) FROM cai.jobs WHERE conversation_id IN (%s) "
                                     "AND status IN ('pending', 'running')" % ids) == "0", 300, 0.2)
    if settled is None:
        problems.append("async jobs did not finish")
    failed_jobs = value("SELECT string_agg(conversation_id || ': ' || error, '; ') FROM cai.jobs "
                        "WHERE conversation_id IN (%s) AND status <> 'done'" % ids)
    if failed_jobs:
        problems.append("async jobs failed: %s" % failed_jobs)
finally:
    value("DROP TRIGGER random_reply_later ON cai.messages")
problems.extend(replies_stored(conversations))

print("%d calls in %.0f s; outcomes: %s" % (3 * SESSIONS * CALLS, time.monotonic() - start,
                                           ", ".join("%s %d" % kv for kv in sorted(outcomes.items()))))
c.check("every call returned text or a clear error, and every committed turn is stored as returned",
        not problems, "%d problems: %s" % (len(problems), "\n".join(problems[:5])))
c.check("the engine process never restarted",
        value("SELECT engine_starts FROM pg_stat_cai") == starts_before,
        "%s -> %s" % (starts_before, value("SELECT engine_starts FROM pg_stat_cai")))
c.check("the engine still serves", value("SELECT status FROM pg_stat_cai") == "ready", "")
c.done()
