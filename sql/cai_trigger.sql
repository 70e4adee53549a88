--
-- cai_reply_trigger answers inserted user turns synchronously.  A user turn gets exactly one
-- reply: turns that cai_chat stores are left to cai_chat.
--
CREATE TRIGGER reply AFTER INSERT ON cai.messages
FOR EACH ROW WHEN (NEW.role = 'user')
EXECUTE FUNCTION cai_reply_trigger('{"max_tokens": 16}');

SELECT cai_new_conversation('You are a helpful assistant.') AS conv \gset
INSERT INTO cai.messages (conversation_id, role, content)
VALUES (:conv, 'user', 'What is the capital of France?');
SELECT role, content, tokens = cai_tokenize(content) AS user_tokens_stored,
       completion_tokens > 0 AS has_usage
FROM cai.messages WHERE conversation_id = :conv ORDER BY id;

-- the trigger and cai_chat give the same greedy reply to the same conversation
SELECT cai_new_conversation('You are a helpful assistant.') AS conv2 \gset
SELECT cai_chat(:conv2, 'What is the capital of France?', '{"max_tokens": 16}') =
       (SELECT content FROM cai.messages WHERE conversation_id = :conv AND role = 'assistant') AS same_reply;

-- cai_chat's own user turn does not fire a second reply
SELECT role FROM cai.messages WHERE conversation_id = :conv2 ORDER BY id;

-- assistant and system rows are not answered
INSERT INTO cai.messages (conversation_id, role, content) VALUES (:conv, 'assistant', 'Anything else?');
SELECT count(*) FROM cai.messages WHERE conversation_id = :conv;

-- the follow-up turn sees the history
INSERT INTO cai.messages (conversation_id, role, content) VALUES (:conv, 'user', 'And of Germany?');
SELECT role, content FROM cai.messages WHERE conversation_id = :conv ORDER BY id;

-- a failing reply rolls back the insert
INSERT INTO cai.messages (conversation_id, role, content) VALUES (:conv, 'user', '');
SELECT count(*) FROM cai.messages WHERE conversation_id = :conv;

DROP TRIGGER reply ON cai.messages;
