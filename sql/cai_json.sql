--
-- Typed replies: response_format (OpenAI's shape) on every generating surface, cai_chat_json and
-- cai_complete_json returning jsonb, per-conversation defaults, the errors, and a trigger that
-- fills typed columns from a constrained reply.  Greedy, so the outputs are fixed.
--
\set ticket_schema '{"type": "object", "properties": {"sentiment": {"enum": ["positive", "negative", "neutral"]}, "product": {"type": "string", "maxLength": 30}, "urgent": {"type": "boolean"}}, "required": ["sentiment", "product", "urgent"], "additionalProperties": false}'

-- the jsonb functions
SELECT cai_complete_json('The capital of France, as JSON:',
                         '{"type": "object", "properties": {"capital": {"type": "string", "maxLength": 20}}, "required": ["capital"]}');
SELECT cai_new_conversation('You are a support assistant.') AS conv \gset
SELECT cai_chat_json(:conv, 'My router X200 stopped working, please help fast!', :'ticket_schema') AS ticket;
SELECT jsonb_typeof(cai_chat_json(:conv, 'Is that urgent? Answer yes or no.', '{"enum": ["yes", "no"]}')) AS answer_type;
-- both turns of each exchange are stored, the reply as its JSON text
SELECT role, CASE WHEN role = 'assistant' THEN jsonb_typeof(content::jsonb) END AS reply_type
FROM cai.messages WHERE conversation_id = :conv ORDER BY id;

-- response_format through cai_chat, cai_chat_stream, cai_complete and cai_chat_completion
SELECT cai_chat(cai_new_conversation(), 'Pick a color.',
                '{"response_format": {"type": "json_schema", "json_schema": {"name": "color", "schema": {"enum": ["red", "green", "blue"]}}}}') AS color;
SELECT string_agg(piece, '') ::jsonb AS streamed
FROM cai_chat_stream(cai_new_conversation(), 'Pick a number from 1 to 5.',
                     '{"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "integer", "minimum": 1, "maximum": 5}}}}') AS piece;
SELECT jsonb_typeof(cai_complete('A person, as a JSON object:', '{"response_format": {"type": "json_object"}, "max_tokens": 60}')::jsonb) AS object;
SELECT r->'choices'->0->>'finish_reason' AS finish, (r->'choices'->0->'message'->>'content')::jsonb AS content
FROM cai_chat_completion('[{"role": "user", "content": "Is water wet?"}]',
                         '{"response_format": {"type": "json_schema", "json_schema": {"name": "b", "strict": true, "schema": {"type": "boolean"}}}}') r;
-- "text" is no constraint
SELECT length(cai_complete('Hello', '{"response_format": {"type": "text"}, "max_tokens": 3}')) > 0 AS free_text;

-- a conversation's default response_format applies to every turn; null lifts it for one call
SELECT cai_new_conversation(NULL, '{"response_format": {"type": "json_schema", "json_schema": {"name": "yn", "schema": {"enum": ["yes", "no"]}}}}') AS conv2 \gset
SELECT cai_chat(:conv2, 'Is the sky blue?') AS constrained_by_default;
SELECT cai_chat(:conv2, 'Now write a short poem.', '{"response_format": null, "max_tokens": 8}') AS free_again;

-- cut by max_tokens: the jsonb functions raise an error and store nothing, the text ones report
-- the finish as "length"
SELECT cai_new_conversation() AS conv3 \gset
SELECT cai_chat_json(:conv3, 'Write a long story.', '{"type": "object", "properties": {"story": {"type": "string", "minLength": 200}}, "required": ["story"]}', '{"max_tokens": 8}');
SELECT count(*) AS stored FROM cai.messages WHERE conversation_id = :conv3;
SELECT cai_complete_json('x', '{"type": "array", "minItems": 50}', '{"max_tokens": 4}');
SELECT r->'choices'->0->>'finish_reason' AS finish
FROM cai_chat_completion('[{"role": "user", "content": "Hi"}]',
                         '{"max_tokens": 3, "response_format": {"type": "json_object"}}') r;

-- errors: unsupported keywords and malformed schemas (from the engine, which names them), bad
-- response_format shapes (from the option parser), stop strings beside a JSON format
SELECT cai_complete_json('x', '{"type": "string", "pattern": "^a+$"}');
SELECT cai_complete_json('x', '{"type": "object", "properties": {"email": {"type": "string", "format": "email"}}}');
SELECT cai_complete_json('x', '{"oneOf": [{"type": "string"}, {"type": "integer"}]}');
SELECT cai_complete_json('x', '{"type": "string", "minLength": 5, "maxLength": 2}');
SELECT cai_complete_json('x', '{"type": "object", "properties": {"a": {"type": "string"}}, "required": ["b"]}');
SELECT cai_complete_json('x', '{"$ref": "#/$defs/missing"}');
SELECT cai_complete_json('x', '{"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}');
SELECT cai_complete_json('x', '{"type": "integer", "minimum": 10, "maximum": 1}');
SELECT cai_complete_json('x', '"string"');
SELECT cai_complete_json('x', NULL);
SELECT cai_complete('x', '{"response_format": "json"}');
SELECT cai_complete('x', '{"response_format": {"type": "xml"}}');
SELECT cai_complete('x', '{"response_format": {"type": "json_schema"}}');
SELECT cai_complete('x', '{"response_format": {"type": "json_schema", "json_schema": {"schema": 3}}}');
SELECT cai_complete('x', '{"response_format": {"type": "json_object", "schema": {}}}');
SELECT cai_complete('x', '{"response_format": {"type": "json_object"}, "stop": "}"}');
SELECT cai_new_conversation(NULL, '{"response_format": {"type": "json"}}');

-- a trigger that turns each support message into typed columns, in the inserting transaction
CREATE TABLE support_tickets (id serial PRIMARY KEY, body text NOT NULL);
CREATE TABLE ticket_facts (ticket_id int REFERENCES support_tickets, sentiment text, product text,
                           urgent boolean);
CREATE FUNCTION extract_ticket_facts() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO ticket_facts
    SELECT NEW.id, f.sentiment, f.product, f.urgent
    FROM jsonb_populate_record(NULL::ticket_facts,
             cai_complete_json('Support message: ' || NEW.body || E'\nFacts as JSON: ',
                 '{"type": "object", "properties": {"product": {"type": "string", "maxLength": 30}, "sentiment": {"enum": ["positive", "negative", "neutral"]}, "urgent": {"type": "boolean"}}, "required": ["product", "sentiment", "urgent"], "additionalProperties": false}',
                 '{"max_tokens": 60}')) f;
    RETURN NEW;
END $$;
CREATE TRIGGER facts AFTER INSERT ON support_tickets FOR EACH ROW EXECUTE FUNCTION extract_ticket_facts();
INSERT INTO support_tickets (body) VALUES ('My X200 router stopped working, I need it today!'),
                                          ('Thanks, the new headphones sound great.');
SELECT t.id, f.sentiment IS NOT NULL AS has_sentiment, f.product IS NOT NULL AS has_product,
       pg_typeof(f.urgent) AS urgent_type
FROM support_tickets t JOIN ticket_facts f ON f.ticket_id = t.id ORDER BY t.id;
SELECT * FROM ticket_facts ORDER BY ticket_id;
DROP TABLE ticket_facts, support_tickets;
DROP FUNCTION extract_ticket_facts();

-- the synchronous reply trigger takes response_format in its argument
CREATE TRIGGER reply_json AFTER INSERT ON cai.messages FOR EACH ROW
EXECUTE FUNCTION cai_reply_trigger('{"response_format": {"type": "json_schema", "json_schema": {"name": "yn", "schema": {"enum": ["yes", "no"]}}}}');
SELECT cai_new_conversation() AS conv4 \gset
INSERT INTO cai.messages (conversation_id, role, content) VALUES (:conv4, 'user', 'Is fire hot?');
SELECT role, content FROM cai.messages WHERE conversation_id = :conv4 ORDER BY id;
DROP TRIGGER reply_json ON cai.messages;
-- the asynchronous one's argument is validated by CREATE TRIGGER (no runner serves this database)
CREATE TRIGGER reply_json_later AFTER INSERT ON cai.messages FOR EACH ROW
EXECUTE FUNCTION cai_enqueue_reply_trigger('{"response_format": {"type": "yaml"}}');
