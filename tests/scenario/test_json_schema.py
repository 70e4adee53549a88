"""Typed replies on the real model: every schema of tests/json_schema/cases.json (nested objects,
arrays of objects, enums, bounded numbers and integers, Unicode strings, anyOf, $defs, ...) with
its prompt, greedy and sampled with two seeds, through cai_chat_completion's response_format,
four sessions at a time (so constrained requests share batches).  Every reply that finished
must parse and validate against its schema (python3-jsonschema, Debian's package); replies cut
by max_tokens are counted and reported.  A few cases go through cai_chat_json and the
asynchronous reply trigger too."""
import json
import threading
import time

from pgtest import Checks, ensure_database, psql, value, wait_for
from pqlib import Conn, PqError
from schema_cases import CASES, MODES, quote, validate

MAX_TOKENS = 160
SESSIONS = 4


c = Checks()
ensure_database()
jobs = [(case, mode, opts) for case in CASES for mode, opts in MODES]
results = []
lock = threading.Lock()


def worker(index):
    conn = Conn("cai_scenario", "cai_json_%d" % index)
    try:
        for n, (case, mode, opts) in enumerate(jobs):
            if n % SESSIONS != index:
                continue
            options = dict(opts, max_tokens=MAX_TOKENS, response_format={
                "type": "json_schema", "json_schema": {"name": case["name"], "schema": case["schema"]}})
            messages = [{"role": "system", "content": "You answer with JSON only."},
                        {"role": "user", "content": case["prompt"]}]
            try:
                reply = json.loads(conn.value("SELECT cai_chat_completion(%s, %s)" % (
                    quote(json.dumps(messages)), quote(json.dumps(options)))))
                choice = reply["choices"][0]
                outcome = (choice["finish_reason"], choice["message"]["content"])
            except PqError as e:
                outcome = ("error", str(e))
            with lock:
                results.append((case, mode, outcome))
    finally:
        conn.close()


start = time.monotonic()
threads = [threading.Thread(target=worker, args=(i,)) for i in range(SESSIONS)]
for t in threads:
    t.start()
for t in threads:
    t.join(1800)
elapsed = time.monotonic() - start

invalid, errors, cut, valid = [], [], [], 0
for case, mode, (finish, content) in results:
    where = "%s (%s)" % (case["name"], mode)
    if finish == "error":
        errors.append("%s: %s" % (where, content))
    elif finish == "length":
        cut.append(where)
    else:
        try:
            why = validate(case["schema"], json.loads(content))
        except ValueError as e:
            why = "not JSON: %s" % e
        if why:
            invalid.append("%s: %s in %r" % (where, why, content[:200]))
        else:
            valid += 1
print("%d schemas x %d modes = %d replies in %.0f s: %d finished and valid, %d cut by max_tokens "
      "(%d), %d invalid, %d errors" % (len(CASES), len(MODES), len(results), elapsed, valid,
                                        len(cut), MAX_TOKENS, len(invalid), len(errors)))
if cut:
    print("cut by max_tokens: %s" % ", ".join(cut))
c.check("the test set has at least 40 schemas", len(CASES) >= 40, "%d" % len(CASES))
c.check("every schema of the test set compiles and every call answers", not errors and
        len(results) == len(jobs), "\n".join(errors[:5]))
c.check("100% of the finished replies parse and validate against their schema", not invalid,
        "\n".join(invalid[:5]))
c.check("most replies finish within max_tokens", valid >= len(jobs) * 3 // 4,
        "%d of %d" % (valid, len(jobs)))

# cai_chat_json returns jsonb valid against the schema, and stores the turns
for case in CASES[:6]:
    conv = value("SELECT cai_new_conversation('You answer with JSON only.')")
    r = value("SELECT cai_chat_json(%s, %s, %s, '{\"max_tokens\": %d}')" % (
        conv, quote(case["prompt"]), quote(json.dumps(case["schema"])), MAX_TOKENS))
    why = validate(case["schema"], json.loads(r))
    c.check("cai_chat_json: %s is valid and stored" % case["name"],
            why is None and value("SELECT count(*) FROM cai.messages WHERE conversation_id = %s" % conv) == "2",
            "%s: %s" % (why, r))

# the asynchronous reply trigger with a conversation's response_format
case = next(x for x in CASES if x["name"] == "support_ticket")
value("DROP TRIGGER IF EXISTS json_reply_later ON cai.messages")
value("CREATE TRIGGER json_reply_later AFTER INSERT ON cai.messages FOR EACH ROW "
      "EXECUTE FUNCTION cai_enqueue_reply_trigger('{\"max_tokens\": %d}')" % MAX_TOKENS)
try:
    conv = value("SELECT cai_new_conversation('You answer with JSON only.', %s)" % quote(json.dumps(
        {"response_format": {"type": "json_schema", "json_schema": {"name": "t", "schema": case["schema"]}}})))
    value("INSERT INTO cai.messages (conversation_id, role, content) VALUES (%s, 'user', %s)"
          % (conv, quote(case["prompt"])))
    done = wait_for(lambda: value("SELECT status FROM cai.jobs WHERE conversation_id = %s" % conv) == "done", 120, 0.2)
    reply = value("SELECT content FROM cai.messages WHERE conversation_id = %s AND role = 'assistant'" % conv)
    why = validate(case["schema"], json.loads(reply)) if reply else "no reply"
    c.check("an asynchronous reply job follows its conversation's response_format",
            done is not None and why is None, "%s: %s" % (why, reply))
finally:
    value("DROP TRIGGER IF EXISTS json_reply_later ON cai.messages")

# a JSON reply that max_tokens cuts is never stored as a turn: cai_chat fails and stores
# neither turn, and a reply job fails with the same error and stores no reply
LONG_STORY = json.dumps({"max_tokens": 8, "response_format": {"type": "json_schema", "json_schema": {
    "name": "s", "schema": {"type": "object", "properties": {"story": {"type": "string", "minLength": 200}},
                            "required": ["story"]}}}})
conv = value("SELECT cai_new_conversation('You answer with JSON only.')")
r = psql("SELECT cai_chat(%s, 'Write a long story.', %s)" % (conv, quote(LONG_STORY)))
c.check("cai_chat refuses a JSON reply cut by max_tokens and stores nothing",
        r.rc != 0 and "cut after 8 tokens" in r.err and
        value("SELECT count(*) FROM cai.messages WHERE conversation_id = %s" % conv) == "0", repr(r))
value("DROP TRIGGER IF EXISTS json_cut_later ON cai.messages")
value("CREATE TRIGGER json_cut_later AFTER INSERT ON cai.messages FOR EACH ROW "
      "EXECUTE FUNCTION cai_enqueue_reply_trigger(%s)" % quote(LONG_STORY))
try:
    conv = value("SELECT cai_new_conversation('You answer with JSON only.')")
    value("INSERT INTO cai.messages (conversation_id, role, content) VALUES (%s, 'user', 'Write a long story.')"
          % conv)
    failed = wait_for(lambda: value("SELECT status FROM cai.jobs WHERE conversation_id = %s" % conv) == "failed",
                      120, 0.2)
    error = value("SELECT error FROM cai.jobs WHERE conversation_id = %s" % conv)
    replies = value("SELECT count(*) FROM cai.messages WHERE conversation_id = %s AND role = 'assistant'" % conv)
    c.check("a reply job whose JSON reply is cut by max_tokens fails and stores no reply",
            failed is not None and "cut after 8 tokens" in error and replies == "0",
            "error %r, %s replies" % (error, replies))
finally:
    value("DROP TRIGGER IF EXISTS json_cut_later ON cai.messages")
c.done()
