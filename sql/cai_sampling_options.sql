--
-- Penalties, filters and logprobs: presence_penalty, frequency_penalty, repetition_penalty,
-- min_p, logit_bias, logprobs and top_logprobs.  Greedy or seeded only, so deterministic.
--
-- Bad values: each error names the option and its range (the ids of logit_bias are checked
-- against the vocabulary by the engine, which knows the model).
SELECT cai_complete('Hi', '{"presence_penalty": 2.5}');
SELECT cai_complete('Hi', '{"presence_penalty": "1"}');
SELECT cai_complete('Hi', '{"frequency_penalty": -3}');
SELECT cai_complete('Hi', '{"frequency_penalty": null, "presence_penalty": null}') IS NOT NULL AS ok;
SELECT cai_complete('Hi', '{"repetition_penalty": 0}');
SELECT cai_complete('Hi', '{"repetition_penalty": 10.5}');
SELECT cai_complete('Hi', '{"repetition_penalty": 1e-50}');
SELECT cai_complete('Hi', '{"repetition_penalty": [1]}');
SELECT cai_complete('Hi', '{"min_p": 1.5}');
SELECT cai_complete('Hi', '{"min_p": -0.1}');
SELECT cai_complete('Hi', '{"min_p": true}');
SELECT cai_complete('Hi', '{"logit_bias": [1, 2]}');
SELECT cai_complete('Hi', '{"logit_bias": {"abc": 1}}');
SELECT cai_complete('Hi', '{"logit_bias": {"-1": 1}}');
SELECT cai_complete('Hi', '{"logit_bias": {"5": 101}}');
SELECT cai_complete('Hi', '{"logit_bias": {"5": "x"}}');
SELECT cai_complete('Hi', '{"logit_bias": {"99999999": 1}}');
SELECT cai_complete('Hi', '{"logprobs": 1}');
SELECT cai_complete('Hi', '{"top_logprobs": 21}');
SELECT cai_complete('Hi', '{"top_logprobs": 2.5}');
SELECT cai_chat_completion('[{"role": "user", "content": "Hi"}]', '{"logit_bias": {"12": -100.5}}');
-- stored conversation defaults are checked when stored
SELECT cai_new_conversation(NULL, '{"min_p": -1}');
SELECT cai_new_conversation(NULL, '{"logit_bias": {"x": 1}}');

-- The greedy reply, then with its first token banned by logit_bias: another reply
SELECT cai_complete('The capital of France is', '{"max_tokens": 6}') AS plain;
SELECT (cai_tokenize(' Paris'))[1] AS paris \gset
SELECT cai_complete('The capital of France is',
	format('{"max_tokens": 6, "logit_bias": {"%s": -100}}', :paris)::jsonb) AS banned;
-- a positive bias makes a token the greedy choice
SELECT (cai_tokenize(' Berlin'))[1] AS berlin \gset
SELECT cai_complete('The capital of France is',
	format('{"max_tokens": 1, "logit_bias": {"%s": 30}}', :berlin)::jsonb) AS biased;

-- Penalties break greedy's loops
SELECT cai_complete('1 1 1 1 1 1 1 1', '{"max_tokens": 8}') AS looping;
SELECT cai_complete('1 1 1 1 1 1 1 1', '{"max_tokens": 8, "repetition_penalty": 3}') AS repetition;
SELECT cai_complete('Write the word hello: hello hello', '{"max_tokens": 8}') AS looping;
SELECT cai_complete('Write the word hello: hello hello',
	'{"max_tokens": 8, "frequency_penalty": 2, "presence_penalty": 2}') AS penalized;

-- min_p = 1 keeps only the likeliest token: sampling at any temperature is then greedy
SELECT cai_complete('The capital of France is', '{"max_tokens": 8, "temperature": 2, "seed": 3, "min_p": 1}')
	= cai_complete('The capital of France is', '{"max_tokens": 8}') AS min_p_1_is_greedy;

-- Conversation defaults: the bias applies to every turn; a call's null restores the default
SELECT cai_new_conversation(NULL,
	format('{"max_tokens": 6, "logit_bias": {"%s": -100}}', :paris)::jsonb) AS conv \gset
SELECT cai_chat(:conv, 'What is the capital of France?') LIKE '%Paris%' AS says_paris;
SELECT cai_chat(:conv, 'What is the capital of France?', '{"logit_bias": null}') LIKE '%Paris%' AS says_paris;

-- logprobs: absent unless asked for
SELECT cai_chat_completion('[{"role": "user", "content": "What is the capital of France?"}]',
	'{"max_tokens": 4}') -> 'choices' -> 0 -> 'logprobs' AS logprobs;
-- greedy: one entry per generated token; each token is its list's first, its logprob the
-- list's largest; the tokens' bytes make up the content
SELECT cai_chat_completion('[{"role": "user", "content": "What is the capital of France?"}]',
	'{"max_tokens": 12, "logprobs": true, "top_logprobs": 3}') AS r \gset
WITH c AS (
	SELECT e, ord FROM jsonb_array_elements(:'r'::jsonb -> 'choices' -> 0 -> 'logprobs' -> 'content')
		WITH ORDINALITY AS t(e, ord))
SELECT count(*) = (:'r'::jsonb -> 'usage' ->> 'completion_tokens')::int
		- (CASE WHEN :'r'::jsonb -> 'choices' -> 0 ->> 'finish_reason' = 'stop' THEN 1 ELSE 0 END)
		AS one_per_token,
	bool_and(jsonb_array_length(e -> 'top_logprobs') = 3) AS three_listed,
	bool_and(e ->> 'token' = e -> 'top_logprobs' -> 0 ->> 'token') AS greedy_is_top,
	bool_and((e ->> 'logprob')::float8 = (e -> 'top_logprobs' -> 0 ->> 'logprob')::float8) AS top_logprob,
	bool_and((e -> 'top_logprobs' -> 0 ->> 'logprob')::float8 >= (e -> 'top_logprobs' -> 1 ->> 'logprob')::float8
		AND (e -> 'top_logprobs' -> 1 ->> 'logprob')::float8 >= (e -> 'top_logprobs' -> 2 ->> 'logprob')::float8) AS ordered,
	bool_and((e ->> 'logprob')::float8 <= 0) AS not_positive,
	string_agg(e ->> 'token', '' ORDER BY ord) = :'r'::jsonb -> 'choices' -> 0 -> 'message' ->> 'content' AS tokens_make_the_text
FROM c;
-- the first token, rounded
SELECT e ->> 'token' AS token, round((e ->> 'logprob')::numeric, 2) AS logprob, e -> 'bytes' AS bytes,
	jsonb_array_length(e -> 'top_logprobs') AS listed
FROM jsonb_array_elements(:'r'::jsonb -> 'choices' -> 0 -> 'logprobs' -> 'content') WITH ORDINALITY AS t(e, ord)
WHERE ord = 1;
-- top_logprobs 0: the token's own logprob only
SELECT jsonb_array_length(cai_chat_completion('[{"role": "user", "content": "Hi"}]',
	'{"max_tokens": 2, "logprobs": true}') -> 'choices' -> 0 -> 'logprobs' -> 'content' -> 0 -> 'top_logprobs') AS listed;
