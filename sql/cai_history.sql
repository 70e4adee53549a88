--
-- Reading conversations back (cai_conversations, cai_history: row-level security holds), and
-- cai_set_partition, which makes a node's conversation ids carry its partition for the router.
--
CREATE ROLE regress_hist_alice IN ROLE cai_user;
CREATE ROLE regress_hist_bob IN ROLE cai_user;

SET ROLE regress_hist_alice;
SELECT cai_new_conversation('You are terse.', '{"max_tokens": 6}') AS conv \gset
SELECT length(cai_chat(:conv, 'Name a colour.')) > 0 AS replied;
SELECT system_prompt, options, turns FROM cai_conversations() WHERE conversation_id = :conv;
SELECT role, content = '' AS empty, prompt_tokens > 0 AS has_prompt_tokens, completion_tokens
FROM cai_history(:conv);

-- bob sees neither the conversation nor its turns
SET ROLE regress_hist_bob;
SELECT count(*) AS bobs_conversations FROM cai_conversations();
SELECT count(*) AS turns_bob_sees FROM cai_history(:conv);
-- and cannot move the id space
SELECT cai_set_partition(1);
RESET ROLE;

-- a node's partition: the high 16 bits of the ids it creates from now on
SELECT cai_set_partition(-1);
SELECT cai_set_partition(32768);
-- conversations of partition 0 exist: this database can only be partition 0
SELECT cai_set_partition(3);
SELECT cai_set_partition(0);
SELECT cai_new_conversation() >> 48 AS partition_of_new_id;

DROP OWNED BY regress_hist_alice, regress_hist_bob;
DROP ROLE regress_hist_alice, regress_hist_bob;
