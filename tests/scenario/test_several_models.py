"""Several models per server: pg_cai.models = 'chat=SmolLM2, base=Gemma 3 270M' serves both at
once, each in an engine process of its own.  Both answer greedily and deterministically, each
with its own model; pg_stat_cai has a row per model and cai_model_info(model) describes each.
kill -9 of one engine while each has a request in flight: the other's request completes with
the same text as before, the killed one's request fails cleanly (58000), the other engine's pid
is unchanged, and the killed engine comes back and answers as before.  A call naming an unknown
model is refused naming the configured ones.  A reload that removes a model stops only its
engine, one that adds it back starts only its engine, and one that gives it another file restarts
only its engine: the other keeps its pid."""
import os
import signal
import threading

from pgtest import Checks, Cluster, wait_for
from pqlib import Conn, PqError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHAT = os.path.realpath(os.environ.get("PG_CAI_TEST_MODEL") or
                        os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
BASE = os.path.realpath(os.environ.get("CAI_GEMMA_MODEL") or
                        os.path.join(ROOT, "models", "gemma-3-270m-q4_k_m.gguf"))
BOTH = "chat=%s, base=%s" % (CHAT, BASE)

c = Checks()
if not os.path.exists(BASE):
    print("SKIP test_several_models: %s is absent (scripts/fetch-model.sh gemma3-270m)" % BASE)
    raise SystemExit(0)

cluster = Cluster({"shared_preload_libraries": "'pg_cai'", "pg_cai.models": "'%s'" % BOTH,
                   "pg_cai.threads": "2", "pg_cai.context_length": "1024",
                   "pg_cai.engine_hang_timeout": "'120s'"})
env = cluster.env()
PROMPT = "Count from one to a thousand in words: one, two, three,"


def sql(query):
    r = cluster.psql(query)
    if r.rc != 0:
        raise RuntimeError("query failed: %s: %r" % (query, r))
    return r.out


def rows():
    """{model_id: (status, engine_pid, engine_starts, running)} from pg_stat_cai."""
    out = sql("SELECT model_id, status, coalesce(engine_pid, 0), engine_starts, running "
              "FROM pg_stat_cai ORDER BY model_id")
    result = {}
    for line in out.splitlines():
        name, status, pid, starts, running = line.split("|")
        result[name] = (status, int(pid), int(starts), int(running))
    return result


def all_ready(names):
    r = rows()
    return sorted(r) == sorted(names) and all(r[n][0] == "ready" for n in names)


def complete(model, max_tokens):
    return ("SELECT cai_complete('%s', '{\"model\": \"%s\", \"max_tokens\": %d, "
            "\"ignore_eos\": true}')" % (PROMPT, model, max_tokens))


def in_thread(query, app):
    """Runs query on a connection of its own; holder[0] gets ('ok', text) or ('error', sqlstate,
    message)."""
    holder = [None]

    def run():
        conn = Conn("postgres", app, env=env)
        try:
            holder[0] = ("ok", conn.value(query))
        except PqError as e:
            holder[0] = ("error", e.sqlstate, str(e))
        finally:
            conn.close()
    t = threading.Thread(target=run)
    t.start()
    return t, holder


def reload_models(setting):
    sql("ALTER SYSTEM SET pg_cai.models = '%s'" % setting)
    sql("SELECT pg_reload_conf()")


try:
    c.check("a cluster serving two models starts", cluster.start(), cluster.log)
    cluster.psql("CREATE EXTENSION pg_cai")
    ready = wait_for(lambda: all_ready(["base", "chat"]), 300, 0.5)
    c.check("both models get an engine process of their own and load", ready is not None,
            repr(wait_for(rows, 5)))
    before = rows()
    c.check("the two engines are two processes",
            before["chat"][1] != before["base"][1] and before["chat"][1] > 0 and before["base"][1] > 0,
            repr(before))
    c.check("cai_model_info(model) describes each model",
            sql("SELECT (cai_model_info('chat')->>'arch') || ' ' || (cai_model_info('base')->>'arch')")
            == "llama gemma3", sql("SELECT cai_model_info('base')"))
    c.check("cai_model_info() describes the first model, the default",
            sql("SELECT cai_model_info() = cai_model_info('chat')") == "t", "")
    # ---- both answer, greedily: the same text twice, different between the models ----------
    ref = {m: sql(complete(m, 120)) for m in ("chat", "base")}
    again = {m: sql(complete(m, 120)) for m in ("chat", "base")}
    c.check("each model answers, the same text twice (greedy)",
            all(ref[m] and ref[m] == again[m] for m in ref), repr((ref, again)))
    c.check("the two models answer differently (each request went to its own model)",
            ref["chat"] != ref["base"], repr(ref))
    c.check("a call without a model goes to the first one",
            sql("SELECT cai_complete('%s', '{\"max_tokens\": 120, \"ignore_eos\": true}')" % PROMPT)
            == ref["chat"], "")
    counted = rows()
    c.check("pg_stat_cai counts each model's requests on its row",
            sql("SELECT string_agg(model_id || '=' || requests_completed, ',' ORDER BY model_id) "
                "FROM pg_stat_cai") == "base=2,chat=3", sql("SELECT model_id, requests_completed FROM pg_stat_cai"))
    ids = {m: sql(f"SELECT cai_tokenize('Hello, world', '{m}')") for m in ("chat", "base")}
    c.check("cai_tokenize(text, model) uses that model's vocabulary (SmolLM2's and Gemma 3's differ)",
            ids["chat"] != ids["base"] and ids["chat"] == sql("SELECT cai_tokenize('Hello, world')"),
            repr(ids))
    c.check("cai_detokenize(ids, model) reads the ids with that model's vocabulary",
            all(sql(f"SELECT cai_detokenize(cai_tokenize('Hello, world', '{m}'), '{m}')") == "Hello, world"
                for m in ("chat", "base")), "")

    r = cluster.psql("\\set VERBOSITY verbose\nSELECT cai_complete('Hi', '{\"model\": \"nope\"}')")
    c.check("an unknown model is refused with SQLSTATE 42704, listing the configured ones",
            r.rc != 0 and "42704" in r.err and 'model "nope" is not configured' in r.err
            and "chat, base" in r.err, repr(r))

    # ---- kill -9 one engine while both have a request in flight --------------------------
    long_chat = complete("chat", 400)
    # the reference through the same client as the call in flight (psql strips its output)
    t_ref, h_ref = in_thread(long_chat, "cai_models_ref")
    t_ref.join(300)
    chat_ref = h_ref[0][1] if h_ref[0] and h_ref[0][0] == "ok" else "(no reference: %r)" % (h_ref[0],)
    chat_pid = rows()["chat"][1]
    base_pid = rows()["base"][1]
    t_chat, h_chat = in_thread(long_chat, "cai_models_chat")
    t_base, h_base = in_thread(complete("base", 400), "cai_models_base")
    both = wait_for(lambda: rows()["chat"][3] == 1 and rows()["base"][3] == 1, 60, 0.05)
    c.check("both models run a request", both is not None, repr(rows()))
    os.kill(base_pid, signal.SIGKILL)
    t_base.join(120)
    t_chat.join(300)
    print("the base request: %r" % (h_base[0],))
    print("the chat request: %r" % ((h_chat[0][0], h_chat[0][1][:60] + "...") if h_chat[0] and h_chat[0][0] == "ok" else h_chat[0],))
    c.check("the killed engine's request fails cleanly (58000, engine crashed)",
            h_base[0] is not None and h_base[0][0] == "error" and h_base[0][1] == "58000"
            and "engine process crashed" in h_base[0][2], repr(h_base[0]))
    got = h_chat[0][1] if h_chat[0] is not None and h_chat[0][0] == "ok" else ""
    at = next((i for i, (a, b) in enumerate(zip(got, chat_ref)) if a != b), min(len(got), len(chat_ref)))
    c.check("the other model's request in flight completes, with the same text as before",
            h_chat[0] is not None and h_chat[0][0] == "ok" and got == chat_ref,
            "%r; differs at %d of %d/%d: %r vs %r" % (h_chat[0][:2] if h_chat[0] else None, at, len(got),
                                                     len(chat_ref), got[at - 40:at + 40], chat_ref[at - 40:at + 40]))
    after = rows()
    c.check("the other model's engine kept its process", after["chat"][1] == chat_pid, repr(after))
    back = wait_for(lambda: rows()["base"][0] == "ready" and rows()["base"][1] not in (0, base_pid), 120, 0.2)
    c.check("the killed engine comes back by itself", back is not None, repr(rows()))
    c.check("pg_stat_cai shows the restart on the killed model's row only",
            rows()["base"][2] == before["base"][2] + 1 and rows()["chat"][2] == before["chat"][2]
            and sql("SELECT engine_last_exit FROM pg_stat_cai WHERE model_id = 'base'").startswith("terminated by signal 9"),
            repr(rows()))
    c.check("the restarted model answers as before", sql(complete("base", 120)) == ref["base"], "")
    with open(cluster.log, errors="replace") as f:
        log = f.read()
    c.check("the server log says which model's engine died and that the others were not affected",
            ('It served model "base"' in log and "other models' requests" in log), log[-800:])

    # ---- reloads: remove a model, add it back; the other keeps its engine -----------------
    chat_pid = rows()["chat"][1]
    reload_models("chat=%s" % CHAT)
    gone = wait_for(lambda: list(rows()) == ["chat"], 30, 0.1)
    c.check("a reload removing a model stops its engine only", gone is not None and
            rows()["chat"][1] == chat_pid, repr(rows()))
    r = cluster.psql("\\set VERBOSITY verbose\nSELECT cai_complete('Hi', '{\"model\": \"base\"}')")
    c.check("the removed model is refused by name", r.rc != 0 and "42704" in r.err and
            'model "base" is not configured' in r.err, repr(r))
    c.check("the remaining model answers", sql(complete("chat", 120)) == ref["chat"], "")
    reload_models(BOTH)
    added = wait_for(lambda: all_ready(["base", "chat"]), 120, 0.2)
    c.check("a reload adding a model starts its engine, and the other keeps its pid",
            added is not None and rows()["chat"][1] == chat_pid, repr(rows()))
    c.check("the added model answers", sql(complete("base", 120)) == ref["base"], "")

    # swap one model's file (the same weights under another path): only its engine restarts
    base_link = os.path.join(cluster.dir, "base.gguf")
    os.symlink(BASE, base_link)
    chat_pid, base_pid, base_starts = rows()["chat"][1], rows()["base"][1], rows()["base"][2]
    reload_models("chat=%s, base=%s" % (CHAT, base_link))
    swapped = wait_for(lambda: rows()["base"][0] == "ready" and rows()["base"][2] == base_starts + 1, 120, 0.2)
    c.check("a reload swapping one model's file restarts its engine only",
            swapped is not None and rows()["base"][1] != base_pid and rows()["chat"][1] == chat_pid,
            repr(rows()))
    c.check("the swapped model answers", sql(complete("base", 120)) == ref["base"], "")
finally:
    cluster.stop()
    if c.failed == 0:
        cluster.remove()
    else:
        print("kept %s for inspection" % cluster.dir)
c.done()
