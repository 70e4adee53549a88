--
-- Row-level security: a role sees and changes only its own conversations, and the functions
-- run as the caller, so they cannot be used to read or write another role's turns.
--
CREATE ROLE regress_cai_alice IN ROLE cai_user;
CREATE ROLE regress_cai_bob IN ROLE cai_user;
CREATE ROLE regress_cai_eve;

SET ROLE regress_cai_alice;
SELECT cai_new_conversation('You are a helpful assistant.') AS alice_conv \gset
SELECT length(cai_chat(:alice_conv, 'My secret is 42. Say OK.', '{"max_tokens": 4}')) > 0 AS replied;
SELECT owner, (SELECT count(*) FROM cai.messages m WHERE m.conversation_id = c.id) AS turns
FROM cai.conversations c;

SET ROLE regress_cai_bob;
SELECT count(*) AS visible_conversations FROM cai.conversations;
SELECT count(*) AS visible_messages FROM cai.messages;
-- alice's conversation does not exist for bob (42704 undefined_object; its id is not shown)
\set VERBOSITY sqlstate
SELECT cai_chat(:alice_conv, 'What is the secret?', '{"max_tokens": 4}');
SELECT cai_chat_stream(:alice_conv, 'What is the secret?', '{"max_tokens": 4}');
\set VERBOSITY default
INSERT INTO cai.messages (conversation_id, role, content) VALUES (:alice_conv, 'user', 'Hi');
INSERT INTO cai.conversations (owner) VALUES ('regress_cai_alice');
UPDATE cai.messages SET content = 'changed' WHERE conversation_id = :alice_conv;
DELETE FROM cai.conversations WHERE id = :alice_conv;
-- bob's own conversation works
SELECT cai_new_conversation() AS bob_conv \gset
SELECT length(cai_chat(:bob_conv, 'Hello', '{"max_tokens": 4}')) > 0 AS replied;
SELECT owner FROM cai.conversations;

-- a role without cai_user may not call anything
SET ROLE regress_cai_eve;
SELECT cai_new_conversation();
SELECT cai_complete('Hello');
SELECT * FROM cai.conversations;

RESET ROLE;
SELECT owner, (SELECT string_agg(role, ',' ORDER BY id) FROM cai.messages m WHERE m.conversation_id = c.id) AS turns
FROM cai.conversations c WHERE owner IN ('regress_cai_alice', 'regress_cai_bob') ORDER BY owner;
SELECT count(*) AS changed_by_bob FROM cai.messages WHERE content = 'changed';
DELETE FROM cai.conversations WHERE owner IN ('regress_cai_alice', 'regress_cai_bob');
DROP ROLE regress_cai_alice, regress_cai_bob, regress_cai_eve;
