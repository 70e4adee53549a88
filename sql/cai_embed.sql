--
-- Embeddings: cai_embed(text) and cai_embed(text[]).  The default model (SmolLM2-135M) names
-- no pooling in its GGUF: its embeddings are the mean of its final hidden states, 576 wide.
--
SELECT array_length(cai_embed('PostgreSQL is a database'), 1) AS dim;
SELECT round(sqrt(sum(v::float8 * v))::numeric, 4) AS norm
FROM unnest(cai_embed('PostgreSQL is a database')) v;
-- the same text, the same vector; its first components, rounded
SELECT cai_embed('hello world') = cai_embed('hello world') AS same;
SELECT array_agg(round(v::numeric, 2)) AS head FROM unnest((cai_embed('hello world'))[1:8]) v;
-- a text is closer to itself reworded than to an unrelated one
WITH e AS (
	SELECT cai_embed('The cat sleeps on the sofa.') a,
		   cai_embed('A cat is sleeping on the couch.') b,
		   cai_embed('SELECT count(*) FROM pg_class;') c
)
SELECT (SELECT sum(x * y) FROM unnest(a, b) u(x, y)) >
	   (SELECT sum(x * y) FROM unnest(a, c) u(x, y)) AS closer
FROM e;
-- model => a name of pg_cai.models ("default": the one model of pg_cai.model), or NULL
SELECT array_length(cai_embed('x', model => 'default'), 1) AS by_name,
	   array_length(cai_embed('x', model => NULL), 1) AS by_null;

-- the array form: one row per text, in order, each the vector of the text embedded alone
SELECT e.ordinality, array_length(e.embedding, 1) AS dim, e.embedding = cai_embed(t.t) AS same_as_alone
FROM cai_embed(ARRAY['a cat', 'a dog sat on the mat', 'a car', 'a cat']) e
JOIN unnest(ARRAY['a cat', 'a dog sat on the mat', 'a car', 'a cat']) WITH ORDINALITY t(t, n)
  ON t.n = e.ordinality
ORDER BY e.ordinality;
SELECT count(*) FROM cai_embed(ARRAY[]::text[]);
SELECT count(*) FROM cai_embed(ARRAY(SELECT 'text number ' || i FROM generate_series(1, 100) i));

-- the retrieve-then-answer recipe of docs/embeddings.md, on real[] (no pgvector): rows
-- embedded in one batched call, the question's nearest two by dot product, then a reply
CREATE TABLE embed_docs (id int PRIMARY KEY, body text NOT NULL, embedding real[]);
INSERT INTO embed_docs (id, body) VALUES
	(1, 'pg_cai runs chat completion inside PostgreSQL.'),
	(2, 'Bananas are yellow fruit that grow in bunches.'),
	(3, 'The pg_cai engine batches the requests of every database session.');
UPDATE embed_docs d SET embedding = e.embedding
FROM cai_embed(ARRAY(SELECT body FROM embed_docs ORDER BY id)) e
WHERE e.ordinality = d.id;
SELECT id, array_length(embedding, 1) AS dim FROM embed_docs ORDER BY id;
WITH q AS (SELECT cai_embed('Where does pg_cai run chat completion?') AS v)
SELECT id FROM embed_docs, q
ORDER BY (SELECT sum(a * b) FROM unnest(embed_docs.embedding, q.v) u(a, b)) DESC LIMIT 2;
WITH q AS (SELECT cai_embed('Where does pg_cai run chat completion?') AS v),
	 hits AS (SELECT body FROM embed_docs, q
			  ORDER BY (SELECT sum(a * b) FROM unnest(embed_docs.embedding, q.v) u(a, b)) DESC
			  LIMIT 2)
SELECT length(cai_chat_completion(jsonb_build_array(
		 jsonb_build_object('role', 'system', 'content',
		   'Answer from these notes only:' || E'\n' || (SELECT string_agg(body, E'\n') FROM hits)),
		 jsonb_build_object('role', 'user', 'content', 'Where does pg_cai run chat completion?')),
	   '{"max_tokens": 16, "temperature": 0}')#>>'{choices,0,message,content}') > 0 AS answered;
DROP TABLE embed_docs;

-- errors
SELECT cai_embed(NULL::text);
SELECT cai_embed('');
SELECT * FROM cai_embed(NULL::text[]);
SELECT * FROM cai_embed(ARRAY['a', NULL]);
SELECT * FROM cai_embed(ARRAY['a', '']);
SELECT * FROM cai_embed(ARRAY[['a'], ['b']]);
\set VERBOSITY terse
SELECT cai_embed('x', model => 'no-such-model');
SELECT * FROM cai_embed(ARRAY['x'], model => 'no-such-model');
\set VERBOSITY default
SELECT cai_embed(repeat('many words ', 2000));

-- granted to cai_user, like the other cai_* functions
SELECT has_function_privilege('cai_user', 'cai_embed(text, text)', 'EXECUTE') AS one,
	   has_function_privilege('cai_user', 'cai_embed(text[], text)', 'EXECUTE') AS many,
	   has_function_privilege('public', 'cai_embed(text, text)', 'EXECUTE') AS public;
