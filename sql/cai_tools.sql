--
-- Tool calls in cai_chat_completion: tools and tool_choice (OpenAI's shapes), calls whose
-- arguments follow the tool's schema, content null and finish_reason "tool_calls", tool turns
-- rendered back in the next request, and the errors, each naming its option.  Greedy, so the
-- outputs are fixed; the call ids are random, so only their shape is shown.
--
\set weather '[{"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city", "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}, "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}}, {"type": "function", "function": {"name": "get_time", "description": "Current time in a time zone", "parameters": {"type": "object", "properties": {"timezone": {"type": "string", "maxLength": 30}}, "required": ["timezone"]}}}]'

CREATE FUNCTION tool_reply(r jsonb) RETURNS TABLE (finish text, content jsonb, n_calls int, call_type text,
                                                  call_id_ok bool, name text, arguments jsonb)
LANGUAGE sql AS $$
  SELECT r->'choices'->0->>'finish_reason', r->'choices'->0->'message'->'content',
         jsonb_array_length(r->'choices'->0->'message'->'tool_calls'),
         r->'choices'->0->'message'->'tool_calls'->0->>'type',
         r->'choices'->0->'message'->'tool_calls'->0->>'id' ~ '^call_[0-9a-f]{24}$',
         r->'choices'->0->'message'->'tool_calls'->0->'function'->>'name',
         (r->'choices'->0->'message'->'tool_calls'->0->'function'->>'arguments')::jsonb
$$;

-- "required": a call from the first token, of one of the tools
SELECT * FROM tool_reply(cai_chat_completion('[{"role": "user", "content": "What is the weather in Paris?"}]',
                                             jsonb_build_object('tools', :'weather'::jsonb, 'tool_choice', 'required')));
-- a named function: that call, whatever the question
SELECT * FROM tool_reply(cai_chat_completion('[{"role": "user", "content": "What is the weather in Paris?"}]',
                                             jsonb_build_object('tools', :'weather'::jsonb,
                                                                'tool_choice', '{"type": "function", "function": {"name": "get_time"}}'::jsonb)));
-- "auto" (the default with tools): the model chooses between a call and text
SELECT * FROM tool_reply(cai_chat_completion('[{"role": "user", "content": "What is the weather in Paris?"}]',
                                             jsonb_build_object('tools', :'weather'::jsonb, 'max_tokens', 16)));
SELECT * FROM tool_reply(cai_chat_completion('[{"role": "user", "content": "Say hello."}]',
                                             jsonb_build_object('tools', :'weather'::jsonb, 'tool_choice', 'auto', 'max_tokens', 12)));
-- "none": text only, although the tools are shown (so the prompt is longer)
SELECT r->'choices'->0->>'finish_reason' AS finish, r->'choices'->0->'message' ? 'tool_calls' AS has_calls,
       (r->'usage'->>'prompt_tokens')::int > 200 AS tools_in_prompt
FROM cai_chat_completion('[{"role": "user", "content": "What is the weather in Paris?"}]',
                         jsonb_build_object('tools', :'weather'::jsonb, 'tool_choice', 'none', 'max_tokens', 8)) r;

-- the next request: the assistant's call (content null) and the tool's result render back; the
-- model answers from it ("none"; SmolLM2 echoes it), or under "auto" may call again (it does)
\set followup '[{"role": "user", "content": "What is the weather in Paris?"}, {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}}]}, {"role": "tool", "tool_call_id": "call_1", "content": "{\\"temperature\\": 18, \\"sky\\": \\"sunny\\"}"}]'
SELECT r->'choices'->0->>'finish_reason' AS finish, r->'choices'->0->'message'->>'content' AS content
FROM cai_chat_completion(:'followup', jsonb_build_object('tools', :'weather'::jsonb, 'tool_choice', 'none', 'max_tokens', 24)) r;
SELECT * FROM tool_reply(cai_chat_completion(:'followup', jsonb_build_object('tools', :'weather'::jsonb, 'max_tokens', 80)));
-- tool turns render even without tools (a conversation that no longer offers them)
SELECT (r->'usage'->>'prompt_tokens')::int > 40 AS rendered
FROM cai_chat_completion(
  '[{"role": "user", "content": "Weather?"},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]},
    {"role": "tool", "tool_call_id": "c", "content": "rain"}]', '{"max_tokens": 4}') r;
-- a call cut by max_tokens is an error, or partial text with allow_partial
SELECT cai_chat_completion('[{"role": "user", "content": "Weather in Paris?"}]',
                           jsonb_build_object('tools', :'weather'::jsonb, 'tool_choice', 'required', 'max_tokens', 3));
SELECT r->'choices'->0->>'finish_reason' AS finish, r->'choices'->0->'message'->>'content' AS content
FROM cai_chat_completion('[{"role": "user", "content": "Weather in Paris?"}]',
                         jsonb_build_object('tools', :'weather'::jsonb, 'tool_choice', 'required', 'max_tokens', 3,
                                            'allow_partial', true)) r;

-- errors, each naming its option
SELECT cai_chat_completion('[{"role": "user", "content": "x"}]', '{"tools": {"type": "function"}}');
SELECT cai_chat_completion('[{"role": "user", "content": "x"}]', '{"tools": [{"type": "function", "function": {"description": "no name"}}]}');
SELECT cai_chat_completion('[{"role": "user", "content": "x"}]', '{"tools": [{"type": "function", "function": {"name": "f"}}, {"type": "function", "function": {"name": "f"}}]}');
SELECT cai_chat_completion('[{"role": "user", "content": "x"}]', '{"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"email": {"type": "string", "pattern": ".+@.+"}}}}}]}');
SELECT cai_chat_completion('[{"role": "user", "content": "x"}]', '{"tools": [{"type": "function", "function": {"name": "f", "parameters": "none"}}]}');
SELECT cai_chat_completion('[{"role": "user", "content": "x"}]',
                           jsonb_build_object('tools', :'weather'::jsonb, 'tool_choice', '{"type": "function", "function": {"name": "get_stock"}}'::jsonb));
SELECT cai_chat_completion('[{"role": "user", "content": "x"}]', '{"tool_choice": "required"}');
SELECT cai_chat_completion('[{"role": "user", "content": "x"}]', '{"tools": [], "tool_choice": {"type": "function", "function": {"name": "f"}}}');
SELECT cai_chat_completion('[{"role": "user", "content": "x"}]', jsonb_build_object('tools', :'weather'::jsonb, 'tool_choice', 'always'));
SELECT cai_chat_completion('[{"role": "user", "content": "x"}]', jsonb_build_object('tools', :'weather'::jsonb, 'tool_choice', 3));
SELECT cai_chat_completion('[{"role": "user", "content": "x"}]', jsonb_build_object('tools', :'weather'::jsonb, 'stop', 'x'));
SELECT cai_chat_completion('[{"role": "tool", "content": "18"}]');
SELECT cai_chat_completion('[{"role": "assistant", "content": null, "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{oops"}}]}]');
SELECT cai_chat_completion('[{"role": "user", "content": "x", "tool_calls": []}]');
-- tools are cai_chat_completion's: elsewhere they are unknown options (terse: the hint lists them)
\set VERBOSITY terse
SELECT cai_complete('x', jsonb_build_object('tools', :'weather'::jsonb));
\set VERBOSITY default

DROP FUNCTION tool_reply(jsonb);
