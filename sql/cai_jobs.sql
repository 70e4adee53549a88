--
-- cai_enqueue_reply_trigger queues a reply job in cai.jobs for each inserted user turn, in the
-- inserting transaction.  No job runner serves the regression database (pg_cai.job_databases
-- lists the scenario tests' database only), so jobs stay pending here and the trigger warns once
-- per transaction.  Answering jobs is tested by tests/scenario/test_async_*.py.
--
CREATE TRIGGER reply_later AFTER INSERT ON cai.messages
FOR EACH ROW EXECUTE FUNCTION cai_enqueue_reply_trigger('{"max_tokens": 16}');

SELECT cai_new_conversation('You are a helpful assistant.') AS conv \gset
INSERT INTO cai.messages (conversation_id, role, content)
VALUES (:conv, 'user', 'What is the capital of France?');
SELECT j.message_id = m.id AS for_the_turn, m.role, j.status, j.attempts, j.options, j.error,
       j.reply_id, j.started_at, j.finished_at, j.created_at IS NOT NULL AS created
FROM cai.jobs j JOIN cai.messages m ON m.id = j.message_id WHERE j.conversation_id = :conv;

-- a rolled-back insert leaves no job
BEGIN;
INSERT INTO cai.messages (conversation_id, role, content) VALUES (:conv, 'user', 'Never mind');
SELECT count(*) AS jobs_inside FROM cai.jobs WHERE conversation_id = :conv;
ROLLBACK;
SELECT count(*) AS jobs_after_rollback FROM cai.jobs WHERE conversation_id = :conv;

-- assistant turns queue nothing, and cai_chat answers its own turn: no job
INSERT INTO cai.messages (conversation_id, role, content) VALUES (:conv, 'assistant', 'Paris.');
SELECT cai_new_conversation('You are a helpful assistant.') AS conv2 \gset
SELECT length(cai_chat(:conv2, 'Hello', '{"max_tokens": 4}')) > 0 AS replied;
SELECT count(*) AS jobs FROM cai.jobs WHERE conversation_id IN (:conv, :conv2);

-- importing a history queues a job only when it ends with a user turn, for that turn
SELECT cai_new_conversation() AS conv3 \gset
INSERT INTO cai.messages (conversation_id, role, content)
VALUES (:conv3, 'user', 'Hi'), (:conv3, 'assistant', 'Hello!'), (:conv3, 'user', 'Bye'),
       (:conv3, 'assistant', 'Goodbye!');
SELECT count(*) AS jobs FROM cai.jobs WHERE conversation_id = :conv3;
INSERT INTO cai.messages (conversation_id, role, content)
VALUES (:conv3, 'user', 'One'), (:conv3, 'assistant', 'Two'), (:conv3, 'user', 'Three');
SELECT m.content FROM cai.jobs j JOIN cai.messages m ON m.id = j.message_id
WHERE j.conversation_id = :conv3;

-- bad input fails the insert
INSERT INTO cai.messages (conversation_id, role, content) VALUES (:conv, 'user', '');
DROP TRIGGER reply_later ON cai.messages;
-- bad options are refused by CREATE TRIGGER; a trigger that escaped that check (created with
-- event triggers off) still fails the insert
CREATE TRIGGER reply_later AFTER INSERT ON cai.messages
FOR EACH ROW EXECUTE FUNCTION cai_enqueue_reply_trigger('{"max_tokens": 0}');
SET session_replication_role = replica;
CREATE TRIGGER reply_later AFTER INSERT ON cai.messages
FOR EACH ROW EXECUTE FUNCTION cai_enqueue_reply_trigger('{"max_tokens": 0}');
RESET session_replication_role;
INSERT INTO cai.messages (conversation_id, role, content) VALUES (:conv, 'user', 'Hello');
DROP TRIGGER reply_later ON cai.messages;
CREATE TABLE not_messages (id bigint, conversation_id bigint, role text, content text);
CREATE TRIGGER reply_later AFTER INSERT ON not_messages
FOR EACH ROW EXECUTE FUNCTION cai_enqueue_reply_trigger();
INSERT INTO not_messages VALUES (1, :conv, 'user', 'Hello');
DROP TABLE not_messages;

-- a user turn gets exactly one reply: both kinds of reply trigger together are refused
CREATE TRIGGER reply_later AFTER INSERT ON cai.messages
FOR EACH ROW EXECUTE FUNCTION cai_enqueue_reply_trigger();
CREATE TRIGGER reply_now AFTER INSERT ON cai.messages
FOR EACH ROW EXECUTE FUNCTION cai_reply_trigger();
INSERT INTO cai.messages (conversation_id, role, content) VALUES (:conv, 'user', 'Twice?');
ALTER TABLE cai.messages DISABLE TRIGGER reply_now;
INSERT INTO cai.messages (conversation_id, role, content) VALUES (:conv, 'user', 'Once.');
DROP TRIGGER reply_now ON cai.messages;
SELECT count(*) AS jobs FROM cai.jobs WHERE conversation_id = :conv;

-- row-level security: a role sees and cancels only its own conversations' jobs, may queue them
-- only through the trigger's columns, and never changes their state
CREATE ROLE regress_cai_jobs_alice IN ROLE cai_user;
CREATE ROLE regress_cai_jobs_bob IN ROLE cai_user;
SET ROLE regress_cai_jobs_alice;
SELECT cai_new_conversation('You are a helpful assistant.') AS alice_conv \gset
INSERT INTO cai.messages (conversation_id, role, content) VALUES (:alice_conv, 'user', 'Hi')
RETURNING id AS alice_msg \gset
SELECT count(*) AS alice_sees FROM cai.jobs;
UPDATE cai.jobs SET status = 'done';
INSERT INTO cai.jobs (message_id, conversation_id, status)
SELECT id, conversation_id, 'done' FROM cai.messages WHERE conversation_id = :alice_conv;
SET ROLE regress_cai_jobs_bob;
SELECT count(*) AS bob_sees FROM cai.jobs;
DELETE FROM cai.jobs;
INSERT INTO cai.jobs (message_id, conversation_id) VALUES (:alice_msg, :alice_conv);
-- nor through a conversation of its own: a job names a turn of its own conversation, so naming
-- another role's turn fails just as naming no turn at all does (no probing which ids exist), and
-- the turn's one job slot stays its owner's
SELECT cai_new_conversation() AS bob_conv \gset
INSERT INTO cai.jobs (message_id, conversation_id) VALUES (:alice_msg + 1, :bob_conv);
INSERT INTO cai.jobs (message_id, conversation_id) VALUES (:alice_msg + 1000000, :bob_conv);
SET ROLE regress_cai_jobs_alice;
INSERT INTO cai.messages (conversation_id, role, content) VALUES (:alice_conv, 'user', 'Again')
RETURNING id = :alice_msg + 1 AS the_probed_id;
SELECT count(*) AS alice_jobs_queued FROM cai.jobs;
DELETE FROM cai.jobs;
RESET ROLE;
SELECT count(*) AS alice_jobs FROM cai.jobs WHERE conversation_id = :alice_conv;

-- pg_stat_cai counts the jobs of this database, and shows throughput
SELECT jobs_pending, jobs_running, jobs_done, jobs_failed FROM pg_stat_cai;
SELECT tokens_per_second > 0 AS has_rate, recent_tokens_per_second >= 0 AS has_recent_rate
FROM pg_stat_cai;

DROP TRIGGER reply_later ON cai.messages;
DELETE FROM cai.jobs;
DELETE FROM cai.conversations WHERE owner IN ('regress_cai_jobs_alice', 'regress_cai_jobs_bob');
DROP ROLE regress_cai_jobs_alice;
DROP ROLE regress_cai_jobs_bob;
