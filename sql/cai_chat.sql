--
-- Conversations: multi-turn chat with greedy decoding, stored turns with their token ids and
-- usage, prefix-cache hits on follow-up turns, streaming, determinism.
--
-- start from an empty prefix cache, so that cache hits below come from this file alone
SELECT cai_cache_reset();
SELECT cai_new_conversation('You are a helpful assistant.') AS conv \gset

SELECT cai_chat(:conv, 'What is the capital of France?', '{"max_tokens": 16}');
SELECT cai_chat(:conv, 'And of Germany?', '{"max_tokens": 16}');
SELECT cai_chat(:conv, 'Thank you!', '{"max_tokens": 16}');

SELECT role, content, prompt_tokens IS NOT NULL AS has_usage, completion_tokens > 0 AS generated
FROM cai.messages WHERE conversation_id = :conv ORDER BY id;

-- user turns store the ids the worker tokenized them to; replies the ids the model generated
SELECT role, tokens = cai_tokenize(content) AS tokens_match_content,
       cai_detokenize(tokens) = content AS detokenize_to_content,
       completion_tokens = array_length(tokens, 1) + 1 OR completion_tokens = array_length(tokens, 1) AS ids_counted
FROM cai.messages WHERE conversation_id = :conv ORDER BY id;

-- every follow-up prompt is longer and starts with the previous turns, whose KV comes from the
-- prefix cache (the previous prompt and reply, to the token)
SELECT prompt_tokens, completion_tokens, cached_tokens,
       prompt_tokens > lag(prompt_tokens + completion_tokens) OVER (ORDER BY id) AS grows,
       cached_tokens <= lag(prompt_tokens + completion_tokens) OVER (ORDER BY id) AS hit_within_history
FROM cai.messages WHERE conversation_id = :conv AND role = 'assistant' ORDER BY id;

-- greedy decoding is deterministic: a second conversation gets the same first reply
SELECT cai_new_conversation('You are a helpful assistant.') AS conv2 \gset
SELECT cai_chat(:conv2, 'What is the capital of France?', '{"max_tokens": 16}') =
       (SELECT content FROM cai.messages WHERE conversation_id = :conv AND role = 'assistant' ORDER BY id LIMIT 1)
       AS same_reply;

-- sampling with a seed is reproducible
SELECT cai_complete('Once upon a time', '{"max_tokens": 12, "temperature": 0.9, "seed": 42}') =
       cai_complete('Once upon a time', '{"max_tokens": 12, "temperature": 0.9, "seed": 42}') AS same_sample;

-- max_tokens bounds the reply; ignore_eos runs to it
SELECT cai_new_conversation() AS conv3 \gset
SELECT length(cai_chat(:conv3, 'Write a long poem about the sea.', '{"max_tokens": 5, "ignore_eos": true}')) > 0 AS replied;
SELECT role, completion_tokens, array_length(tokens, 1) AS n_tokens
FROM cai.messages WHERE conversation_id = :conv3 ORDER BY id;

-- streaming: one row per piece, as generated; the pieces make the stored reply
SELECT cai_new_conversation('You are a helpful assistant.') AS conv4 \gset
CREATE TEMP TABLE pieces AS
SELECT row_number() OVER () AS n, piece
FROM (SELECT cai_chat_stream(:conv4, 'What is the capital of France?', '{"max_tokens": 16}') AS piece) s;
SELECT count(*) > 1 AS several_rows FROM pieces;
SELECT string_agg(piece, '' ORDER BY n) AS streamed FROM pieces;
SELECT (SELECT string_agg(piece, '' ORDER BY n) FROM pieces) =
       (SELECT content FROM cai.messages WHERE conversation_id = :conv4 AND role = 'assistant') AS stored_as_streamed,
       (SELECT string_agg(piece, '' ORDER BY n) FROM pieces) =
       (SELECT content FROM cai.messages WHERE conversation_id = :conv2 AND role = 'assistant') AS same_as_cai_chat;
SELECT role FROM cai.messages WHERE conversation_id = :conv4 ORDER BY id;

-- a stream read only partly stores nothing: the reply is unfinished
SELECT cai_chat_stream(:conv4, 'Tell me a story.', '{"max_tokens": 40, "ignore_eos": true}') LIMIT 2;
SELECT count(*) FROM cai.messages WHERE conversation_id = :conv4;

-- stop strings end the reply before them
SELECT cai_new_conversation('You are a helpful assistant.') AS conv5 \gset
SELECT cai_chat(:conv5, 'What is the capital of France?', '{"max_tokens": 16, "stop": "Paris"}');
SELECT content, tokens IS NULL AS ids_not_stored
FROM cai.messages WHERE conversation_id = :conv5 AND role = 'assistant';

-- stop strings against replies whose text is still empty or ends in part of a character (this
-- reply starts with emoji, three tokens each): the call used to crash the engine process
SELECT cai_chat(cai_new_conversation(), 'Say hi with emoji', '{"stop": "zzz", "max_tokens": 12}');
SELECT cai_new_conversation() AS conv6 \gset
SELECT cai_chat(:conv6, 'Say hi with emoji', '{"stop": ["zzz", "\ud83d\udc69"], "max_tokens": 12}') = '' AS empty;
SELECT role, content, completion_tokens FROM cai.messages WHERE conversation_id = :conv6 ORDER BY id;
-- a stop string split across tokens
SELECT cai_chat(cai_new_conversation('You are a helpful assistant.'),
                'What is the capital of France?', '{"max_tokens": 16, "stop": "ital of Fr"}');
SELECT cai_complete('Say hi with emoji', '{"stop": "\u00e9", "max_tokens": 6}') IS NOT NULL AS completed;
SELECT string_agg(piece, '|') FROM cai_chat_stream(cai_new_conversation(), 'Say hi with emoji',
                                                 '{"stop": "zzz", "max_tokens": 7}') AS piece;

-- deleting a conversation deletes its turns
DELETE FROM cai.conversations WHERE id = :conv5;
SELECT count(*) FROM cai.messages WHERE conversation_id = :conv5;
