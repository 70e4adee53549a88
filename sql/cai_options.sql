--
-- Options: every key is checked for its name, JSON type and range; conversation options are
-- defaults under each call's.  All of these fail before any generation.
--
SELECT cai_new_conversation('You are a helpful assistant.') AS conv \gset

SELECT cai_chat(:conv, 'Hi', '{"max_token": 5}');
SELECT cai_chat(:conv, 'Hi', '[1, 2]');
SELECT cai_chat(:conv, 'Hi', '"max_tokens"');
SELECT cai_chat(:conv, 'Hi', '{"max_tokens": 0}');
SELECT cai_chat(:conv, 'Hi', '{"max_tokens": 2000000}');
SELECT cai_chat(:conv, 'Hi', '{"max_tokens": 2.5}');
SELECT cai_chat(:conv, 'Hi', '{"max_tokens": "5"}');
SELECT cai_chat(:conv, 'Hi', '{"temperature": -0.1}');
SELECT cai_chat(:conv, 'Hi', '{"temperature": 2.5}');
SELECT cai_chat(:conv, 'Hi', '{"temperature": true}');
-- beyond double precision: the option's own error, with the number written short
SELECT cai_chat(:conv, 'Hi', '{"temperature": 1e400}');
SELECT cai_chat(:conv, 'Hi', '{"temperature": -1e400}');
SELECT cai_chat(:conv, 'Hi', '{"top_p": 0}');
SELECT cai_chat(:conv, 'Hi', '{"top_p": 1.5}');
-- positive, but 0 in the engine's single precision
SELECT cai_chat(:conv, 'Hi', '{"top_p": 1e-50}');
SELECT cai_chat(:conv, 'Hi', '{"top_p": 1e-400}');
SELECT cai_chat(:conv, 'Hi', '{"top_k": -1}');
SELECT cai_chat(:conv, 'Hi', '{"top_k": 1000001}');
SELECT cai_chat(:conv, 'Hi', '{"seed": -5}');
SELECT cai_chat(:conv, 'Hi', '{"seed": 1e30}');
SELECT cai_chat(:conv, 'Hi', '{"stop": 3}');
SELECT cai_chat(:conv, 'Hi', '{"stop": ["a", 3]}');
SELECT cai_chat(:conv, 'Hi', '{"stop": ""}');
SELECT cai_chat(:conv, 'Hi', '{"stop": ["1","2","3","4","5","6","7","8","9"]}');
SELECT cai_chat(:conv, 'Hi', jsonb_build_object('stop', repeat('x', 300)));
SELECT cai_chat(:conv, 'Hi', '{"truncate": "yes"}');
SELECT cai_chat(:conv, 'Hi', '{"ignore_eos": 1}');
SELECT cai_complete('Hi', '{"temperature": 3}');
SELECT cai_chat_completion('[{"role": "user", "content": "Hi"}]', '{"nope": 1}');
SELECT cai_new_conversation(NULL, '{"max_tokens": -3}');
SELECT cai_new_conversation(NULL, '[]');
-- nothing was stored by the failed calls
SELECT count(*) FROM cai.messages WHERE conversation_id = :conv;

-- whole-number floats are integers; null restores a default; NULL options are no options
SELECT cai_new_conversation(NULL, '{"max_tokens": 3.0, "seed": 7, "stop": null, "top_k": 40}') IS NOT NULL AS ok;
-- each limit's edge itself is accepted (the request limits of src/common/cai.h)
SELECT cai_new_conversation(NULL, '{"temperature": 2, "top_p": 1, "top_k": 1000000, "max_tokens": 1048576}') IS NOT NULL AS ok;

-- conversation options are defaults; per-call options win, key by key
SELECT cai_new_conversation('You are a helpful assistant.', '{"max_tokens": 3, "ignore_eos": true}') AS conv2 \gset
SELECT options FROM cai.conversations WHERE id = :conv2;
SELECT length(cai_chat(:conv2, 'Tell me about the sea.')) > 0 AS replied;
SELECT length(cai_chat(:conv2, 'More, please.', '{"max_tokens": 5}')) > 0 AS replied;
SELECT length(cai_chat(:conv2, 'Even more.', NULL)) > 0 AS replied;
SELECT role, completion_tokens FROM cai.messages WHERE conversation_id = :conv2 ORDER BY id;
