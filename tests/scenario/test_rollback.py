"""A rolled-back or failed call leaves no turns; a committed one leaves exactly two."""
from pgtest import Checks, ensure_database, psql, value

c = Checks()
ensure_database()
conv = value("SELECT cai_new_conversation('You are brief.')")
count = "SELECT count(*) FROM cai.messages WHERE conversation_id = %s" % conv
opts = '{"max_tokens": 4}'

r = psql("BEGIN; SELECT cai_chat(%s, 'Hello there', '%s'); ROLLBACK;" % (conv, opts))
c.check("the call inside the rolled-back transaction succeeds", r.rc == 0 and r.out != "", repr(r))
c.check("a rolled-back transaction leaves no turns", value(count) == "0", value(count))

r = psql("BEGIN; SELECT cai_chat(%s, 'Hello there', '%s'); SELECT 1/0; COMMIT;" % (conv, opts))
c.check("a transaction failing after the call leaves no turns", r.rc != 0 and value(count) == "0",
        "%r, %s rows" % (r, value(count)))

r = psql("SET statement_timeout = '300ms'; SELECT cai_chat(%s, 'Tell me a long story', "
         "'{\"max_tokens\": 1500, \"ignore_eos\": true}')" % conv)
c.check("a call cut by statement_timeout leaves no turns",
        r.rc != 0 and "statement timeout" in r.err and value(count) == "0", repr(r))

r = psql("SELECT cai_chat(%s, 'Hello there', '%s')" % (conv, opts))
c.check("a committed call leaves a user and an assistant turn",
        r.rc == 0 and value("SELECT string_agg(role, ',' ORDER BY id) FROM cai.messages "
                            "WHERE conversation_id = %s" % conv) == "user,assistant",
        repr(r))
c.done()
