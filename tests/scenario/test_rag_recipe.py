"""The README's retrieve-then-answer recipe, as a user would run it: a table of notes whose
embedding column cai_embed_trigger keeps in step (pgvector's vector where the server has pgvector,
real[] otherwise), then one statement that embeds the question, takes the closest notes and answers
from them with cai_chat.  The closest note must be the one that answers the question; the reply
is stored in a conversation whose system prompt holds the retrieved notes.
"""
from pgtest import Checks, ensure_database, psql, value, wait_for

c = Checks()
ensure_database()

have_vector = value("SELECT count(*) FROM pg_available_extensions WHERE name = 'vector'") == "1"
print("pgvector %s" % ("available: vector(576) column" if have_vector else "not installed here: real[] column"))
if have_vector:
    value("CREATE EXTENSION IF NOT EXISTS vector")
    column, question_vector = "vector(576)", "cai_embed(%s)::vector"
    distance = "embedding <=> q.v"
else:
    column, question_vector = "real[]", "cai_embed(%s)"
    distance = "-(SELECT sum(a * b) FROM unnest(embedding, q.v) AS t(a, b))"

NOTES = ["The office cat is called Miso and sleeps on the printer.",
         "Invoices are paid on the first Monday of each month.",
         "The wifi password is printed on the fridge door.",
         "Parking is free for visitors after six in the evening."]
QUESTION = "What is the office cat called?"

value("DROP TABLE IF EXISTS rag_notes; DELETE FROM cai.jobs WHERE kind = 'embed'")
r = psql("CREATE TABLE rag_notes (id bigint PRIMARY KEY, body text NOT NULL, embedding %s); "
         "CREATE TRIGGER rag_notes_embed AFTER INSERT OR UPDATE OF body ON rag_notes "
         "FOR EACH ROW EXECUTE FUNCTION cai_embed_trigger('body', 'embedding'); "
         "INSERT INTO rag_notes (id, body) VALUES %s"
         % (column, ", ".join("(%d, '%s')" % (i + 1, n) for i, n in enumerate(NOTES))))
c.check("the notes table, its trigger and its rows", r.rc == 0, repr(r))
filled = wait_for(lambda: value("SELECT count(*) FROM rag_notes WHERE embedding IS NOT NULL") == str(len(NOTES)),
                  180, interval=0.3)
c.check("the job runners fill every note's embedding", filled is not None,
        value("SELECT string_agg(status || coalesce(': ' || error, ''), '; ') FROM cai.jobs WHERE kind = 'embed'"))

q = "'%s'" % QUESTION
ranked = value("WITH q AS (SELECT %s AS v) SELECT string_agg(id::text, ',' ORDER BY %s) FROM rag_notes, q"
               % (question_vector % q, distance))
print("notes by distance to the question: %s" % ranked)
c.check("the closest note is the one about the cat", ranked.split(",")[0] == "1", ranked)

recipe = ("WITH q AS (SELECT %s AS v) "
          "SELECT cai_chat(cai_new_conversation('Answer from these notes only.' || E'\\n' || string_agg(body, E'\\n')), "
          "%s, '{\"max_tokens\": 24}') "
          "FROM (SELECT body FROM rag_notes, q ORDER BY %s LIMIT 2) hits" % (question_vector % q, q, distance))
r = psql(recipe)
print("the answer: %r" % r.out)
c.check("one statement retrieves and answers", r.rc == 0 and r.out.strip() != "", repr(r))
stored = value("SELECT c.system_prompt LIKE '%%Miso%%' FROM cai.conversations c "
               "JOIN cai.messages m ON m.conversation_id = c.id WHERE m.content = %s ORDER BY c.id DESC LIMIT 1" % q)
c.check("the answer's conversation holds the retrieved note", stored == "t", stored)

value("DROP TABLE rag_notes; DELETE FROM cai.jobs WHERE kind = 'embed'")
c.done()
