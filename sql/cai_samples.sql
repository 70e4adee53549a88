--
-- n parallel samples: the prompt prefilled once, its KV shared by the samples, sample i drawn
-- with seed + i.  Seeded only, so deterministic.
--
-- Bad values of n name the option and its range, in every function that takes options.
SELECT cai_complete('Hi', '{"n": 0}');
SELECT cai_complete('Hi', '{"n": 17}');
SELECT cai_complete('Hi', '{"n": "2"}');
SELECT cai_complete('Hi', '{"n": 1.5}');
SELECT cai_chat_completion('[{"role": "user", "content": "Hi"}]', '{"n": -1}');
SELECT cai_complete_n('Hi', 0);
SELECT cai_complete_n('Hi', 17);
SELECT cai_complete_n('Hi', NULL);
SELECT cai_new_conversation(NULL, '{"n": 99}');
-- cai_complete returns one completion: it points to cai_complete_n
SELECT cai_complete('Hi', '{"n": 2}');
-- a conversation stores one reply: n > 1 is refused there, stored or asked for in the call
SELECT cai_new_conversation(NULL, '{"max_tokens": 4}') AS conv \gset
SELECT cai_chat(:conv, 'Hi', '{"n": 2}');
SELECT count(*) AS stored FROM cai.messages WHERE conversation_id = :conv;
SELECT cai_chat(:conv, 'Hi', '{"n": 1}') IS NOT NULL AS n_1_is_fine;
-- tools are one reply's business
SELECT cai_chat_completion('[{"role": "user", "content": "Weather in Paris?"}]',
	'{"n": 2, "tools": [{"type": "function", "function": {"name": "weather"}}], "tool_choice": "required"}');

-- n choices, each with its index, message, finish_reason and logprobs; the usage counts the
-- prompt once and every choice's tokens
SELECT cai_chat_completion('[{"role": "user", "content": "Tell me a story."}]',
	'{"n": 3, "temperature": 1, "seed": 42, "max_tokens": 6, "ignore_eos": true, "logprobs": true}') AS r \gset
SELECT jsonb_array_length(:'r'::jsonb -> 'choices') AS choices,
	(SELECT array_agg((c ->> 'index')::int ORDER BY o) FROM jsonb_array_elements(:'r'::jsonb -> 'choices')
		WITH ORDINALITY AS t(c, o)) AS indexes,
	(SELECT bool_and(c ->> 'finish_reason' = 'length' AND c -> 'message' ->> 'role' = 'assistant'
					 AND jsonb_array_length(c -> 'logprobs' -> 'content') = 6)
		FROM jsonb_array_elements(:'r'::jsonb -> 'choices') AS t(c)) AS shaped,
	(:'r'::jsonb -> 'usage' ->> 'completion_tokens')::int AS completion_tokens,
	(:'r'::jsonb -> 'usage' ->> 'total_tokens')::int
		= (:'r'::jsonb -> 'usage' ->> 'prompt_tokens')::int + 18 AS prompt_once;
-- each choice is the n = 1 reply with its seed
SELECT (:'r'::jsonb -> 'choices' -> i -> 'message' ->> 'content') =
	(cai_chat_completion('[{"role": "user", "content": "Tell me a story."}]',
		format('{"temperature": 1, "seed": %s, "max_tokens": 6, "ignore_eos": true}', 42 + i)::jsonb)
		-> 'choices' -> 0 -> 'message' ->> 'content') AS same_as_alone
FROM generate_series(0, 2) AS i;
-- different seeds, different choices
SELECT count(DISTINCT c -> 'message' ->> 'content') > 1 AS differ
FROM jsonb_array_elements(:'r'::jsonb -> 'choices') AS t(c);
-- n = 1 keeps the shape it always had
SELECT jsonb_array_length(cai_chat_completion('[{"role": "user", "content": "Hi"}]',
	'{"n": 1, "max_tokens": 2}') -> 'choices') AS one_choice;

-- cai_complete_n: an array of n completions, element i + 1 the cai_complete of seed + i
SELECT cai_complete_n('Once upon a time', 4, '{"temperature": 1, "seed": 7, "max_tokens": 5}') AS a \gset
SELECT array_length(:'a'::text[], 1) AS n;
SELECT (:'a'::text[])[i + 1] = cai_complete('Once upon a time',
	format('{"temperature": 1, "seed": %s, "max_tokens": 5}', 7 + i)::jsonb) AS same_as_alone
FROM generate_series(0, 3) AS i;
-- the n argument wins over an "n" option; greedy samples are all the greedy reply
SELECT array_length(g, 1) AS n, g[1] = g[2] AS greedy_twice,
	g[1] = cai_complete('The capital of France is', '{"max_tokens": 4}') AS greedy
FROM cai_complete_n('The capital of France is', 2, '{"n": 5, "max_tokens": 4}') AS g;
