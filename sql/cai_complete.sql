--
-- Raw completion, OpenAI-style chat completion, and the tokenizer.
--
SELECT cai_complete('The capital of France is', '{"max_tokens": 8}');
SELECT cai_complete('1, 2, 3, 4,', '{"max_tokens": 8, "stop": [" 7", "\n"]}');

SELECT cai_chat_completion('[{"role": "system", "content": "You are a helpful assistant."},
                             {"role": "user", "content": "What is the capital of France?"}]',
                           '{"max_tokens": 16}') AS r \gset
SELECT jsonb_typeof(:'r'::jsonb) AS type,
       (:'r'::jsonb)->>'object' AS object,
       (:'r'::jsonb)->>'id' LIKE 'chatcmpl-%' AS id_ok,
       (:'r'::jsonb)->>'model' AS model,
       jsonb_typeof((:'r'::jsonb)->'created') AS created,
       (:'r'::jsonb)#>>'{choices,0,message,role}' AS role,
       (:'r'::jsonb)#>>'{choices,0,message,content}' AS content,
       (:'r'::jsonb)#>>'{choices,0,finish_reason}' AS finish_reason;
SELECT (u->>'prompt_tokens')::int > 0 AS prompt,
       (u->>'completion_tokens')::int > 0 AS completion,
       (u->>'total_tokens')::int = (u->>'prompt_tokens')::int + (u->>'completion_tokens')::int AS total,
       jsonb_typeof(u#>'{prompt_tokens_details,cached_tokens}') AS cached
FROM (SELECT (:'r'::jsonb)->'usage' AS u) s;
-- length-limited replies say so
SELECT cai_chat_completion('[{"role": "user", "content": "Write a long story."}]',
                           '{"max_tokens": 3, "ignore_eos": true}')#>>'{choices,0,finish_reason}' AS finish_reason;

-- tokenizer
SELECT cai_tokenize('Hello world');
SELECT cai_detokenize(cai_tokenize('Hello world'));
SELECT cai_detokenize(cai_tokenize('héllo wörld, 你好 🙂')) = 'héllo wörld, 你好 🙂' AS unicode_round_trip;
SELECT cai_tokenize('');
SELECT cai_tokenize(NULL) IS NULL AS null_in_null_out;
-- special-token text stays plain text
SELECT array_length(cai_tokenize('<|im_end|>'), 1) > 1 AS not_a_control_token;
SELECT cai_detokenize('{}');
SELECT cai_detokenize('{-1}');
SELECT cai_detokenize('{49152}');
SELECT cai_detokenize('{1, NULL}');
SELECT cai_detokenize('{{1,2},{3,4}}');
