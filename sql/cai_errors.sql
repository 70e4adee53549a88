--
-- Bad input gets a clear error with a fitting SQLSTATE, and a failed call stores nothing.
--
\set VERBOSITY default
SELECT cai_new_conversation('You are a helpful assistant.') AS conv \gset

-- unknown conversation, NULL and empty arguments
SELECT cai_chat(-1, 'Hello');
SELECT cai_chat(NULL, 'Hello');
SELECT cai_chat(:conv, NULL);
SELECT cai_chat(:conv, '');
SELECT cai_chat_stream(:conv, '');
SELECT cai_complete(NULL);
SELECT cai_complete('');

-- chat_completion messages must be a non-empty array of {role, content}
SELECT cai_chat_completion(NULL);
SELECT cai_chat_completion('{"role": "user", "content": "Hi"}');
SELECT cai_chat_completion('[]');
SELECT cai_chat_completion('[1]');
SELECT cai_chat_completion('[{"role": "user"}]');
SELECT cai_chat_completion('[{"role": "user", "content": 5}]');
SELECT cai_chat_completion('[{"role": "tool", "content": "Hi"}]');

-- the SQLSTATEs
DO $$
DECLARE
	call text;
BEGIN
	FOREACH call IN ARRAY ARRAY[
		$c$SELECT cai_chat(-1, 'Hello')$c$,
		$c$SELECT cai_chat(-1, NULL)$c$,
		$c$SELECT cai_chat(-1, '')$c$,
		$c$SELECT cai_chat(-1, 'Hi', '{"foo": 1}')$c$,
		$c$SELECT cai_complete('Hi', '{"max_tokens": 0}')$c$,
		$c$SELECT cai_complete(repeat('hello ', 1500), '{"truncate": false}')$c$]
	LOOP
		BEGIN
			EXECUTE call;
		EXCEPTION WHEN OTHERS THEN
			RAISE NOTICE '%: %', SQLSTATE, call;
		END;
	END LOOP;
END
$$;

-- a prompt longer than the context (1024 tokens in the test cluster): an error when truncation is off ...
SELECT cai_chat(:conv, repeat('hello ', 1500), '{"max_tokens": 4, "truncate": false}');
SELECT cai_complete(repeat('hello ', 1500), '{"max_tokens": 4, "truncate": false}');
-- ... and a single turn that cannot fit is an error even with truncation
SELECT cai_chat(:conv, repeat('hello ', 1500), '{"max_tokens": 4}');
SELECT count(*) FROM cai.messages WHERE conversation_id = :conv;

-- a long history: with truncation (the default) the oldest turns are dropped, without it the
-- call fails
INSERT INTO cai.messages (conversation_id, role, content)
SELECT :conv, r, repeat(w || ' ', 300)
FROM (VALUES (1, 'user', 'apple'), (2, 'assistant', 'banana'), (3, 'user', 'cherry'),
             (4, 'assistant', 'grape')) v(n, r, w) ORDER BY n;
SELECT cai_chat(:conv, 'Hi', '{"max_tokens": 4, "truncate": false}');
SELECT count(*) FROM cai.messages WHERE conversation_id = :conv;
SELECT length(cai_chat(:conv, 'Hi', '{"max_tokens": 4}')) > 0 AS replied;
SELECT prompt_tokens <= 1024 - 4 AS fits FROM cai.messages
WHERE conversation_id = :conv AND role = 'assistant' ORDER BY id DESC LIMIT 1;
-- raw completion keeps the end of an over-long prompt
SELECT length(cai_complete(repeat('hello ', 1500), '{"max_tokens": 2}')) > 0 AS replied;

-- the trigger function is only a trigger
SELECT cai_reply_trigger();
CREATE TABLE not_messages (id int);
CREATE TRIGGER t AFTER INSERT ON not_messages FOR EACH ROW EXECUTE FUNCTION cai_reply_trigger();
INSERT INTO not_messages VALUES (1);
DROP TABLE not_messages;
CREATE TRIGGER t BEFORE INSERT ON cai.messages FOR EACH ROW EXECUTE FUNCTION cai_reply_trigger();
INSERT INTO cai.messages (conversation_id, role, content) VALUES (:conv, 'user', 'Hi');
DROP TRIGGER t ON cai.messages;
