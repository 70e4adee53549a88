--
-- Typed replies through the text functions: a JSON reply cut by max_tokens is an error and
-- nothing is stored (unless allow_partial), whitespace is compact unless asked free,
-- properties come out in the schema's order (text overloads, propertyOrdering), and stored
-- options are validated when they are written.  Greedy, so the outputs are fixed.
--
\set long_story '{"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "object", "properties": {"story": {"type": "string", "minLength": 200}}, "required": ["story"]}}}, "max_tokens": 8}'
\set long_story_partial '{"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "object", "properties": {"story": {"type": "string", "minLength": 200}}, "required": ["story"]}}}, "max_tokens": 8, "allow_partial": true}'

-- cut by max_tokens: cai_chat fails and stores neither turn
SELECT cai_new_conversation() AS conv \gset
SELECT cai_chat(:conv, 'Write a long story.', :'long_story');
SELECT count(*) AS stored FROM cai.messages WHERE conversation_id = :conv;
-- in a transaction, the user turn goes with it
BEGIN;
INSERT INTO cai.messages (conversation_id, role, content) VALUES (:conv, 'user', 'Earlier turn.');
SELECT cai_chat(:conv, 'Write a long story.', :'long_story');
COMMIT;
SELECT count(*) AS stored FROM cai.messages WHERE conversation_id = :conv;
-- cai_chat_stream: the pieces went out, the turns are not stored
SELECT string_agg(piece, '') FROM cai_chat_stream(:conv, 'Write a long story.', :'long_story') AS piece;
SELECT count(*) AS stored FROM cai.messages WHERE conversation_id = :conv;
-- cai_complete, and a conversation's default response_format
SELECT cai_complete('Once upon a time', :'long_story');
SELECT cai_new_conversation(NULL, :'long_story') AS conv_default \gset
SELECT cai_chat(:conv_default, 'Write a long story.');
SELECT count(*) AS stored FROM cai.messages WHERE conversation_id = :conv_default;
-- the synchronous reply trigger: the insert fails
CREATE TRIGGER reply_cut AFTER INSERT ON cai.messages FOR EACH ROW
EXECUTE FUNCTION cai_reply_trigger(:'long_story');
INSERT INTO cai.messages (conversation_id, role, content) VALUES (:conv, 'user', 'Describe a cat.');
DROP TRIGGER reply_cut ON cai.messages;
SELECT count(*) AS stored FROM cai.messages WHERE conversation_id = :conv;
-- allow_partial: the cut text is returned and stored as asked
SELECT cai_chat(:conv, 'Write a long story.', :'long_story_partial') AS partial;
SELECT role, content FROM cai.messages WHERE conversation_id = :conv ORDER BY id;
SELECT cai_complete('Once upon a time', :'long_story_partial') AS partial;
-- cai_chat_completion stores nothing and reports the cut as OpenAI does
SELECT r->'choices'->0->>'finish_reason' AS finish, r->'choices'->0->'message'->>'content' AS content
FROM cai_chat_completion('[{"role": "user", "content": "Write a long story."}]', :'long_story') r;
-- the jsonb functions cannot return a cut value, allow_partial or not
SELECT cai_complete_json('Once upon a time', '{"type": "array", "minItems": 50}', '{"max_tokens": 4, "allow_partial": true}');
-- the options are validated like the others
SELECT cai_complete('x', '{"allow_partial": "yes"}');
SELECT cai_complete('x', '{"json_whitespace": "pretty"}');
SELECT cai_complete('x', '{"json_whitespace": 1}');

-- whitespace: compact by default (one space at most, after ':' or ','), free on request
SELECT r->'choices'->0->'message'->>'content' AS compact,
       r->'usage'->>'completion_tokens' AS tokens
FROM cai_chat_completion('[{"role": "user", "content": "Describe a dog as JSON."}]',
     '{"max_tokens": 200, "response_format": {"type": "json_schema", "json_schema": {"name": "dog", "schema": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"}, "breed": {"type": "string", "maxLength": 20}}, "required": ["name", "age", "breed"]}}}}') r;
SELECT r->'choices'->0->'message'->>'content' AS free,
       r->'usage'->>'completion_tokens' AS tokens
FROM cai_chat_completion('[{"role": "user", "content": "Describe a dog as JSON."}]',
     '{"max_tokens": 200, "json_whitespace": "free", "response_format": {"type": "json_schema", "json_schema": {"name": "dog", "schema": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"}, "breed": {"type": "string", "maxLength": 20}}, "required": ["name", "age", "breed"]}}}}') r;

-- property order: a literal schema is read as written (the text overload), so "reasoning"
-- comes before "answer"; a jsonb schema has its keys sorted, unless "propertyOrdering" says
\set reasoning_first '{"type": "object", "properties": {"reasoning": {"type": "string", "maxLength": 60}, "answer": {"type": "integer"}}, "required": ["reasoning", "answer"]}'
SELECT cai_new_conversation() AS conv2 \gset
SELECT cai_chat_json(:conv2, 'What is 2 + 3?', :'reasoning_first') ? 'reasoning' AS typed;
SELECT cai_chat_json(:conv2, 'What is 2 + 3?', :'reasoning_first'::json) ? 'reasoning' AS typed;
SELECT cai_chat_json(:conv2, 'What is 2 + 3?', :'reasoning_first'::jsonb) ? 'reasoning' AS typed;
SELECT cai_chat_json(:conv2, 'What is 2 + 3?',
       jsonb_set(:'reasoning_first'::jsonb, '{propertyOrdering}', '["reasoning", "answer"]')) ? 'reasoning' AS typed;
SELECT content, content LIKE '{"reasoning"%' AS reasoning_first
FROM cai.messages WHERE conversation_id = :conv2 AND role = 'assistant' ORDER BY id;
SELECT cai_complete('Q: What is 2 + 3?\nA as JSON:',
       '{"max_tokens": 60, "response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": {"type": "object", "properties": {"reasoning": {"type": "string", "maxLength": 40}, "answer": {"type": "integer"}}, "propertyOrdering": ["reasoning", "answer"], "required": ["reasoning", "answer"]}}}}') AS ordered;
SELECT cai_complete_json('x', '{"properties": {"a": {}}, "propertyOrdering": ["b"]}');
-- a literal schema is the text overload; the text is read strictly (no duplicate keys)
SELECT cai_complete_json('x', '{"type": "string", "type": "integer"}');
SELECT cai_complete_json('x', '{"type": "string", "type": "boolean"}'::jsonb, '{"max_tokens": 5}') IS NOT NULL AS jsonb_keeps_the_last;

-- a schema nested deeper than the parser goes says so (it is valid JSON)
SELECT cai_complete_json('x', repeat('{"items": ', 70) || '{}' || repeat('}', 70));
SELECT cai_new_conversation(NULL, jsonb_build_object('response_format', jsonb_build_object('type', 'json_schema', 'json_schema', jsonb_build_object('schema', (repeat('{"items": ', 70) || '{}' || repeat('}', 70))::jsonb))));

-- stored options are validated when written: cai_new_conversation, direct INSERT and UPDATE
SELECT cai_new_conversation(NULL, '{"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "string", "pattern": "a"}}}}');
SELECT cai_new_conversation(NULL, '{"response_format": {"type": "json_object"}, "stop": "}"}');
INSERT INTO cai.conversations (options) VALUES ('{"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "strng"}}}}');
INSERT INTO cai.conversations (options) VALUES ('{"max_tokens": 0}');
UPDATE cai.conversations SET options = '{"response_format": {"type": "json_schema", "json_schema": {"schema": {"minimum": 5, "maximum": 1}}}}' WHERE id = :conv2;
UPDATE cai.conversations SET options = '{"response_format": {"type": "json_schema", "json_schema": {"schema": {"enum": ["yes", "no"]}}}}' WHERE id = :conv2;
SELECT options FROM cai.conversations WHERE id = :conv2;
SELECT cai_validate_options('{"json_whitespace": "free", "allow_partial": true}');
SELECT cai_validate_options('{"response_format": {"type": "json_schema", "json_schema": {"schema": {"$ref": "#/nowhere"}}}}');
-- a job's options, however the row is written
INSERT INTO cai.messages (conversation_id, role, content) VALUES (:conv2, 'user', 'Queued by hand.')
RETURNING id AS queued_message \gset
INSERT INTO cai.jobs (message_id, conversation_id, options) VALUES (:queued_message, :conv2, '{"top_k": -1}');

-- a reply trigger's options are checked by CREATE TRIGGER, not first by a user's insert
CREATE TRIGGER bad_schema AFTER INSERT ON cai.messages FOR EACH ROW
EXECUTE FUNCTION cai_reply_trigger('{"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "object", "properties": {"a": {"format": "email"}}}}}}');
CREATE TRIGGER bad_schema AFTER INSERT ON cai.messages FOR EACH ROW
EXECUTE FUNCTION cai_enqueue_reply_trigger('{"response_format": {"type": "json_schema", "json_schema": {"schema": {"required": ["x"]}}}}');
CREATE TRIGGER bad_json AFTER INSERT ON cai.messages FOR EACH ROW
EXECUTE FUNCTION cai_enqueue_reply_trigger('{"max_tokens": 4');
SELECT count(*) AS triggers FROM pg_trigger WHERE tgname IN ('bad_schema', 'bad_json');
-- good ones, and other triggers, are created as before
CREATE TRIGGER good_schema AFTER INSERT ON cai.messages FOR EACH ROW
EXECUTE FUNCTION cai_enqueue_reply_trigger('{"response_format": {"type": "json_schema", "json_schema": {"schema": {"enum": ["yes", "no"]}}}}');
DROP TRIGGER good_schema ON cai.messages;
CREATE TABLE plain (x int);
CREATE FUNCTION plain_noop() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NEW; END $$;
CREATE TRIGGER plain_noop BEFORE INSERT ON plain FOR EACH ROW EXECUTE FUNCTION plain_noop('not json');
DROP TABLE plain;
DROP FUNCTION plain_noop();
