-- Models by name: the regress cluster serves the one model of pg_cai.model, named "default"
-- (several at once through pg_cai.models are tests/scenario/test_several_models.py's).
SHOW pg_cai.models;
SELECT model_id, status FROM pg_stat_cai;
SELECT cai_model_info('default') = cai_model_info() AS same;

-- the model option: the default model by name answers as the default does; other names and
-- other types are refused before anything is stored
SELECT cai_complete('The sky is', '{"max_tokens": 5, "model": "default"}')
	 = cai_complete('The sky is', '{"max_tokens": 5}') AS same;
-- (its SQLSTATE, message, detail and hint, without the source location a verbose report adds)
DO $$
DECLARE
	state text;
	message text;
	detail text;
	hint text;
BEGIN
	PERFORM cai_complete('The sky is', '{"model": "chat"}');
EXCEPTION WHEN OTHERS THEN
	GET STACKED DIAGNOSTICS state = RETURNED_SQLSTATE, message = MESSAGE_TEXT,
		detail = PG_EXCEPTION_DETAIL, hint = PG_EXCEPTION_HINT;
	RAISE NOTICE '% %: % / %', state, message, detail, hint;
END
$$;
SELECT cai_complete('The sky is', '{"model": 3}');
SELECT cai_complete('The sky is', '{"model": {"name": "default"}}');
SELECT cai_chat_completion('[{"role": "user", "content": "Hi"}]', '{"model": "chat"}');
SELECT cai_model_info('chat');
SELECT cai_model_info(NULL) IS NULL AS null_model;
SELECT cai_new_conversation(NULL, '{"model": true}');
-- the tokenizer of a named model (NULL: the first); an unknown name is refused
SELECT cai_tokenize('Hello world', 'default') = cai_tokenize('Hello world') AS same_ids,
       cai_tokenize('Hello world', NULL) = cai_tokenize('Hello world') AS null_is_first,
       cai_detokenize(cai_tokenize('Hello world'), 'default') AS text,
       cai_tokenize(NULL, 'default') IS NULL AS null_in_null_out;
SELECT cai_tokenize('Hello world', 'chat');
SELECT cai_detokenize(ARRAY[1, 2], 'chat');

-- a conversation keeps the model of its first reply: recorded then, and another is refused
SELECT cai_new_conversation() AS conv \gset
SELECT model FROM cai.conversations WHERE id = :conv;
SELECT length(cai_chat(:conv, 'Hi', '{"max_tokens": 3}')) >= 0 AS replied;
SELECT model FROM cai.conversations WHERE id = :conv;
-- (the error names the conversation, whose id depends on the tests before: masked)
DO $$
BEGIN
	PERFORM cai_chat((SELECT max(id) FROM cai.conversations), 'Hi again', '{"model": "base"}');
EXCEPTION WHEN invalid_parameter_value THEN
	RAISE NOTICE '%', regexp_replace(SQLERRM, '[0-9]+', 'N');
END
$$;
SELECT length(cai_chat(:conv, 'Hi again', '{"max_tokens": 3, "model": "default"}')) >= 0 AS replied;
SELECT count(*) FROM cai.messages WHERE conversation_id = :conv;

-- pg_cai.models is checked entry by entry (ALTER SYSTEM runs the check without applying it)
ALTER SYSTEM SET pg_cai.models = 'chat';
ALTER SYSTEM SET pg_cai.models = 'Chat=/m/a.gguf';
ALTER SYSTEM SET pg_cai.models = 'chat=/m/a.gguf, chat=/m/b.gguf';
ALTER SYSTEM SET pg_cai.models = 'chat=/m/a.gguf, embed=';
ALTER SYSTEM SET pg_cai.models = 'chat=/m/a.gguf,,embed=/m/b.gguf';
ALTER SYSTEM SET pg_cai.models = 'a=/m/a, b=/m/b, c=/m/c, d=/m/d, e=/m/e';
ALTER SYSTEM SET pg_cai.models = 'a_name_that_is_longer_than_32_chars=/m/a.gguf';
SHOW pg_cai.models;
