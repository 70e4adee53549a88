/*
 * test_tools.c — tool calling: declarations checked, tool JSON written as Jinja's tojson writes
 * it, the families' tool formats rendered (Qwen's markers as single tokens), replies read back,
 * and generated calls that always parse and validate against their tool's schema, on a
 * synthetic model whose unconstrained output is noise.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "chat_template.h"
#include "json.h"
#include "json_validate.h"
#include "synth_model.h"
#include "test.h"
#include "tokenizer_fixtures.h"
#include "tools.h"

static const char weather_tools[] =
	"[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": "
	"\"Weather <now> & 'here'\", \"parameters\": {\"type\": \"object\", \"properties\": "
	"{\"city\": {\"type\": \"string\", \"maxLength\": 12}, \"days\": {\"type\": \"integer\", "
	"\"minimum\": 1, \"maximum\": 7}}, \"required\": [\"city\"]}}},"
	" {\"type\": \"function\", \"function\": {\"name\": \"ping\"}}]";

static cai_tool_set *
parse_tools(const char *json)
{
	cai_tool_set *set = NULL;
	cai_error	err;

	if (cai_tool_set_parse(json, strlen(json), &set, &err) != CAI_OK)
		fprintf(stderr, "    tools: %s\n", err.message);
	return set;
}

/* A declaration refused, with a message containing what */
static void
check_refused(const char *json, const char *what)
{
	cai_tool_set *set = NULL;
	cai_error	err;
	cai_status	st = cai_tool_set_parse(json, strlen(json), &set, &err);

	CHECK_MSG(st == CAI_ERR_INVALID_ARGUMENT && set == NULL && strstr(err.message, what),
			  "%s: status %d, message \"%s\", expected one with \"%s\"", json, (int) st,
			  st == CAI_OK ? "" : err.message, what);
	cai_tool_set_free(set);
}

TEST(tools_declarations_are_checked)
{
	cai_tool_set *set = parse_tools(weather_tools);

	CHECK(set && cai_tool_set_count(set) == 2);
	CHECK_EQ_INT(cai_tool_set_find(set, "ping"), 1);
	CHECK_EQ_INT(cai_tool_set_find(set, "pong"), -1);
	cai_tool_set_free(set);

	check_refused("{}", "must be an array");
	check_refused("[1]", "tools[0] is not an object");
	check_refused("[{\"type\": \"tool\", \"function\": {\"name\": \"a\"}}]", "\"type\": \"function\"");
	check_refused("[{\"type\": \"function\", \"function\": {}}]", "no \"name\"");
	check_refused("[{\"type\": \"function\", \"function\": {\"name\": \"a b\"}}]", "letters, digits");
	check_refused("[{\"type\": \"function\", \"function\": {\"name\": \"a\"}},"
				  " {\"type\": \"function\", \"function\": {\"name\": \"a\"}}]", "declared twice");
	check_refused("[{\"type\": \"function\", \"function\": {\"name\": \"a\", \"parameters\": "
				  "{\"type\": \"string\", \"pattern\": \"x+\"}}}]", "unsupported JSON Schema keyword \"pattern\"");
	check_refused("[{\"type\": \"function\", \"function\": {\"name\": \"a\", \"parameters\": 3}}]",
				  "must be a JSON Schema object");
	check_refused("[{\"type\": \"function\", \"function\": {\"name\": \"a\", \"bogus\": 1}}]",
				  "unknown key \"bogus\"");
	check_refused("[{\"type\": \"function\", \"function\": {\"name\": \"a\", \"description\": 1}}]",
				  "description must be a string");
}

TEST(tools_json_is_written_as_jinja_tojson)
{
	static const char in[] = "{\"b\": \"<x>&'\\u00e9\\ud83d\\ude00\\n\", \"a\": [1, {\"d\": null, \"c\": true}], \"e\": {}}";
	json_doc   *doc = NULL;
	cai_buf		b = {0};
	cai_error	err;

	CHECK_EQ_INT(json_parse(in, strlen(in), 0, &doc, &err), CAI_OK);
	if (!doc)
		return;
	/* jinja2 3.1.6: {{ x|tojson }} and {{ x|tojson(indent=4) }} of the same value */
	CHECK(cai_tool_json_write(json_doc_root(doc), 0, &b) && cai_buf_append(&b, "", 1));
	CHECK_MSG(strcmp(b.data, "{\"a\": [1, {\"c\": true, \"d\": null}], \"b\": "
					 "\"\\u003cx\\u003e\\u0026\\u0027\\u00e9\\ud83d\\ude00\\n\", \"e\": {}}") == 0,
			  "got %s", b.data);
	b.len = 0;
	CHECK(cai_tool_json_write(json_doc_root(doc), 4, &b) && cai_buf_append(&b, "", 1));
	CHECK_MSG(strcmp(b.data, "{\n    \"a\": [\n        1,\n        {\n            \"c\": true,\n"
					 "            \"d\": null\n        }\n    ],\n    \"b\": \"\\u003cx\\u003e\\u0026"
					 "\\u0027\\u00e9\\ud83d\\ude00\\n\",\n    \"e\": {}\n}") == 0, "got %s", b.data);
	cai_buf_free(&b);
	json_doc_free(doc);
}

/* Control tokens of the fixture: every format's markup, and Qwen's tool markers */
static const char *const markup[] = {
	"<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>", "<|start_header_id|>",
	"<|end_header_id|>", "<|eot_id|>", "<bos>", "<start_of_turn>", "<end_of_turn>", "<eos>"
};
static const char *const tool_markers[] = {"<tool_call>", "</tool_call>"};

static const char calls_json[] = "[{\"name\": \"get_weather\", \"arguments\": {\"days\": 2, \"city\": \"Paris\"}}]";

/* system, user, an assistant call, two results */
static const cai_chat_message tool_chat[] = {
	{CAI_ROLE_SYSTEM, "Be brief.", NULL, 0, NULL},
	{CAI_ROLE_USER, "Weather in Paris?", NULL, 0, NULL},
	{CAI_ROLE_ASSISTANT, "", NULL, 0, calls_json},
	{CAI_ROLE_TOOL, "{\"temp\": 18}", NULL, 0, NULL},
	{CAI_ROLE_TOOL, "sunny", NULL, 0, NULL},
};

static char *
render(const char *template_name, const cai_tokenizer *tok, const cai_tool_set *tools,
	   const cai_chat_message *msgs, int n, int *n_markers)
{
	cai_chat_template tmpl;
	cai_tokens	t;
	cai_error	err;
	char	   *text = NULL;
	int32_t		marker = cai_tokenizer_find(tok, "<tool_call>");

	cai_tokens_init(&t);
	if (cai_chat_template_by_name(template_name, tok, &tmpl, &err) == CAI_OK &&
		cai_chat_template_render_tools(&tmpl, tok, msgs, n, tools, true, &t, NULL, &err) == CAI_OK)
		text = fixture_detokenize(tok, t.ids, t.n);
	else
		fprintf(stderr, "    render: %s\n", err.message);
	*n_markers = 0;
	for (int i = 0; i < t.n; i++)
		*n_markers += t.ids[i] == marker;
	cai_tokens_free(&t);
	return text;
}

static void
check_text(const char *got, const char *expected)
{
	CHECK_MSG(got && strcmp(got, expected) == 0, "rendered\n%s\n    expected\n%s",
			  got ? got : "(null)", expected);
}

#define QWEN_TOOL_BLOCK \
	"# Tools\n\nYou may call one or more functions to assist with the user query.\n\n" \
	"You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n" \
	"{\"function\": {\"description\": \"Weather \\u003cnow\\u003e \\u0026 \\u0027here\\u0027\", " \
	"\"name\": \"get_weather\", \"parameters\": {\"properties\": {\"city\": {\"maxLength\": 12, " \
	"\"type\": \"string\"}, \"days\": {\"maximum\": 7, \"minimum\": 1, \"type\": \"integer\"}}, " \
	"\"required\": [\"city\"], \"type\": \"object\"}}, \"type\": \"function\"}\n" \
	"{\"function\": {\"name\": \"ping\"}, \"type\": \"function\"}\n</tools>\n\n" \
	"For each function call, return a json object with function name and arguments within " \
	"<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": " \
	"<args-json-object>}\n</tool_call>"

/*
 * The expected texts are Qwen2.5-Instruct's and Llama 3.1's published chat templates (their
 * tool branches) applied by hand to tool_chat; tests/tools/compare_jinja.py renders the same
 * with jinja2.
 */
TEST(tools_render_in_each_family_format)
{
	cai_tokenizer *tok = fixture_bpe("smollm", markup, 11, NULL, 0, tool_markers, 2, 0, 10, false);
	cai_tool_set *tools = parse_tools(weather_tools);
	char	   *text;
	int			n_markers;

	CHECK(tok && tools);
	if (!tok || !tools)
		goto done;
	text = render("chatml", tok, tools, tool_chat, 5, &n_markers);
	check_text(text, "<|im_start|>system\nBe brief.\n\n" QWEN_TOOL_BLOCK "<|im_end|>\n"
			   "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
			   "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
			   "{\"city\": \"Paris\", \"days\": 2}}\n</tool_call><|im_end|>\n"
			   "<|im_start|>user\n<tool_response>\n{\"temp\": 18}\n</tool_response>\n"
			   "<tool_response>\nsunny\n</tool_response><|im_end|>\n<|im_start|>assistant\n");
	/* the markers are the vocabulary's own tokens, as llama.cpp tokenizes the template's text */
	CHECK_EQ_INT(n_markers, 3);
	free(text);

	text = render("llama3", tok, tools, tool_chat, 5, &n_markers);
	check_text(text, "<|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\n"
			   "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\nBe brief.<|eot_id|>"
			   "<|start_header_id|>user<|end_header_id|>\n\nGiven the following functions, please "
			   "respond with a JSON for a function call with its proper arguments that best answers "
			   "the given prompt.\n\nRespond in the format {\"name\": function name, \"parameters\": "
			   "dictionary of argument name and its value}.Do not use variables.\n\n"
			   "{\n    \"function\": {\n        \"description\": \"Weather \\u003cnow\\u003e \\u0026 "
			   "\\u0027here\\u0027\",\n        \"name\": \"get_weather\",\n        \"parameters\": {\n"
			   "            \"properties\": {\n                \"city\": {\n                    "
			   "\"maxLength\": 12,\n                    \"type\": \"string\"\n                },\n"
			   "                \"days\": {\n                    \"maximum\": 7,\n                    "
			   "\"minimum\": 1,\n                    \"type\": \"integer\"\n                }\n"
			   "            },\n            \"required\": [\n                \"city\"\n            ],\n"
			   "            \"type\": \"object\"\n        }\n    },\n    \"type\": \"function\"\n}\n\n"
			   "{\n    \"function\": {\n        \"name\": \"ping\"\n    },\n    \"type\": \"function\"\n}\n\n"
			   "Weather in Paris?<|eot_id|>"
			   "<|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": \"get_weather\", "
			   "\"parameters\": {\"city\": \"Paris\", \"days\": 2}}<|eot_id|>"
			   "<|start_header_id|>ipython<|end_header_id|>\n\n\"{\\\"temp\\\": 18}\"<|eot_id|>"
			   "<|start_header_id|>ipython<|end_header_id|>\n\n\"sunny\"<|eot_id|>"
			   "<|start_header_id|>assistant<|end_header_id|>\n\n");
	free(text);

	/* the generic format: Hermes' text in plain turns (Gemma: the system text opens the user turn) */
	text = render("gemma", tok, tools, tool_chat, 5, &n_markers);
	check_text(text, "<start_of_turn>user\nBe brief.\n\n" QWEN_TOOL_BLOCK "\n\nWeather in Paris?"
			   "<end_of_turn>\n<start_of_turn>model\n<tool_call>\n{\"name\": \"get_weather\", "
			   "\"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n</tool_call><end_of_turn>\n"
			   "<start_of_turn>user\n<tool_response>\n{\"temp\": 18}\n</tool_response><end_of_turn>\n"
			   "<start_of_turn>user\n<tool_response>\nsunny\n</tool_response><end_of_turn>\n"
			   "<start_of_turn>model\n");
	/* plain text to the tokenizer: a marker in caller content never becomes a control token */
	CHECK_EQ_INT(n_markers, 0);
	free(text);

	/* without a system prompt, Gemma's turn starts with the block */
	text = render("gemma", tok, tools, tool_chat + 1, 1, &n_markers);
	check_text(text, "<start_of_turn>user\n" QWEN_TOOL_BLOCK "\n\nWeather in Paris?<end_of_turn>\n"
			   "<start_of_turn>model\n");
	free(text);
done:
	cai_tool_set_free(tools);
	cai_tokenizer_free(tok);
}

TEST(tools_reply_is_read_back)
{
	char	   *name = NULL,
			   *args = NULL;
	cai_error	err;
	static const char hermes[] = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": [1, 2]}}\n</tool_call>\n";
	static const char llama[] = " {\"name\": \"g\", \"parameters\": {}}";
	static const char dup_key[] =
		"{\"name\": \"q\", \"arguments\": {\"sql\": {\"k\": 1, \"k\": \"\"}, \"limit\": 10}}";

	CHECK_EQ_INT(cai_tool_reply_parse(hermes, strlen(hermes), &name, &args, &err), CAI_OK);
	CHECK(name && strcmp(name, "f") == 0 && args && strcmp(args, "{\"a\":[1,2]}") == 0);
	free(name);
	free(args);
	CHECK_EQ_INT(cai_tool_reply_parse(llama, strlen(llama), &name, &args, &err), CAI_OK);
	CHECK(name && strcmp(name, "g") == 0 && args && strcmp(args, "{}") == 0);
	free(name);
	free(args);
	/* a free-form argument object that repeats a key (the constraint allows it) reads back */
	CHECK_EQ_INT(cai_tool_reply_parse(dup_key, strlen(dup_key), &name, &args, &err), CAI_OK);
	CHECK(name && strcmp(name, "q") == 0 && args &&
		  strcmp(args, "{\"sql\":{\"k\":1,\"k\":\"\"},\"limit\":10}") == 0);
	free(name);
	free(args);
	CHECK_EQ_INT(cai_tool_reply_parse("Hello", 5, &name, &args, &err), CAI_ERR_INVALID_ARGUMENT);
	CHECK_EQ_INT(cai_tool_reply_parse("{\"name\": 1, \"arguments\": {}}", 28, &name, &args, &err),
				 CAI_ERR_INVALID_ARGUMENT);
}

/* ---------------------------------------------------------------------------------------------
 * Generation on a synthetic model
 * ------------------------------------------------------------------------------------------- */

static const char synth_tools[] =
	"[{\"type\": \"function\", \"function\": {\"name\": \"set_alarm\", \"parameters\": {\"type\": "
	"\"object\", \"properties\": {\"hour\": {\"type\": \"integer\", \"minimum\": 0, \"maximum\": 23}, "
	"\"label\": {\"type\": \"string\", \"maxLength\": 6}, \"days\": {\"type\": \"array\", \"items\": "
	"{\"enum\": [\"mon\", \"tue\"]}, \"maxItems\": 2}}, \"required\": [\"hour\", \"days\"]}}},"
	" {\"type\": \"function\", \"function\": {\"name\": \"lookup\", \"parameters\": {\"$defs\": "
	"{\"q\": {\"type\": \"string\", \"minLength\": 1, \"maxLength\": 5}}, \"type\": \"object\", "
	"\"properties\": {\"query\": {\"$ref\": \"#/$defs/q\"}, \"exact\": {\"type\": \"boolean\"}}, "
	"\"required\": [\"query\", \"exact\"]}}}]";

static cai_model *
synth_model(char *path, size_t cap)
{
	synth_model_config cfg;
	cai_model_params mp;
	cai_model  *model = NULL;
	cai_error	err;

	synth_model_default_config(&cfg);
	cfg.n_layers = 2;
	cfg.d_model = 64;
	cfg.n_heads = 4;
	cfg.n_kv_heads = 2;
	cfg.d_ff = 128;
	cfg.context_length = 1024;
	cfg.seed = 11;
	snprintf(path, cap, "/tmp/cai_test_tools_%d.gguf", (int) getpid());
	if (synth_model_write(path, &cfg, &err) != CAI_OK)
		return NULL;
	cai_model_params_default(&mp);
	mp.n_threads = 1;
	if (cai_model_load(path, &mp, &model, &err) != CAI_OK)
		fprintf(stderr, "    load: %s\n", err.message);
	unlink(path);
	return model;
}

/* Generates one reply; its text in text (cap bytes), the finish reason returned. */
static cai_finish_reason
generate(cai_engine *engine, const cai_model *model, const cai_tool_set *tools, int choice,
		 const char *name, float temperature, uint64_t seed, char *text, size_t cap)
{
	cai_chat_message msgs[] = {{CAI_ROLE_USER, "Wake me at seven.", NULL, 0, NULL}};
	cai_prompt_params pp = {.add_generation_prompt = true, .tools = tools};
	cai_prompt	prompt;
	cai_request_params p;
	cai_error	err;
	uint64_t	id;
	size_t		len = 0;
	cai_finish_reason finish = CAI_FINISH_ERROR;

	text[0] = '\0';
	if (cai_chat_build_prompt(model, msgs, 1, &pp, &prompt, &err) != CAI_OK)
		return CAI_FINISH_ERROR;
	memset(&p, 0, sizeof(p));
	p.prompt = prompt.ids;
	p.n_prompt = prompt.n_ids;
	cai_sampling_params_default(&p.sampling);
	p.sampling.temperature = temperature;
	p.sampling.seed = seed;
	p.sampling.max_tokens = 200;
	p.tools = tools;
	p.tool_choice = choice;
	p.tool_name = name;
	if (cai_engine_submit(engine, &p, &id, &err) != CAI_OK)
		fprintf(stderr, "    submit: %s\n", err.message);
	else
		for (finish = CAI_FINISH_NONE; finish == CAI_FINISH_NONE;)
		{
			const cai_event *ev;
			int			n_ev;

			if (cai_engine_step(engine, &ev, &n_ev, &err) != CAI_OK)
				break;
			for (int i = 0; i < n_ev; i++)
			{
				if (len + ev[i].text_len < cap)
				{
					memcpy(text + len, ev[i].text, ev[i].text_len);
					len += ev[i].text_len;
					text[len] = '\0';
				}
				finish = ev[i].finish;
			}
		}
	cai_prompt_free(&prompt);
	return finish;
}

/* Whether text is one call of a declared tool whose arguments validate against its schema. */
static bool
call_is_valid(const char *text, const char *tools_json, const char *want_name)
{
	char	   *name = NULL,
			   *args = NULL;
	cai_error	err;
	json_doc   *tools = NULL,
			   *inst = NULL;
	bool		ok = false;

	if (cai_tool_reply_parse(text, strlen(text), &name, &args, &err) != CAI_OK)
		return false;
	if (json_parse(tools_json, strlen(tools_json), 0, &tools, &err) == CAI_OK &&
		json_parse(args, strlen(args), 0, &inst, &err) == CAI_OK)
	{
		const json_value *arr = json_doc_root(tools);

		for (size_t i = 0; i < arr->u.array.n; i++)
		{
			const json_value *fn = json_object_get(arr->u.array.items[i], "function");
			const json_value *params = json_object_get(fn, "parameters");

			if (strcmp(json_object_get(fn, "name")->u.string.bytes, name) == 0)
				ok = (!want_name || strcmp(name, want_name) == 0) &&
					jv_validate(params, params, json_doc_root(inst), 0);
		}
	}
	json_doc_free(tools);
	json_doc_free(inst);
	free(name);
	free(args);
	return ok;
}

/*
 * A random model's output is noise: every call it makes under "required" or a named function
 * still parses and validates, greedy and sampled; under "auto" the reply is a valid call exactly
 * when it starts with the marker.
 */
TEST(tools_generated_calls_always_validate)
{
	char		path[128];
	char		text[4096];
	cai_model  *model = synth_model(path, sizeof(path));
	cai_engine *engine = NULL;
	cai_engine_params ep;
	cai_tool_set *tools = parse_tools(synth_tools);
	cai_error	err;
	int			n_valid = 0,
				n_calls = 0;

	CHECK(model && tools);
	if (!model || !tools)
		goto done;
	cai_engine_params_default(&ep);
	ep.device = "cpu";
	ep.n_threads = 1;
	ep.context_length = 1024;
	if (cai_engine_create(model, &ep, &engine, &err) != CAI_OK)
	{
		CHECK_MSG(false, "engine: %s", err.message);
		goto done;
	}
	for (int seed = 0; seed < 6; seed++)
	{
		const char *named = seed % 2 ? "lookup" : "set_alarm";
		cai_finish_reason f;

		f = generate(engine, model, tools, CAI_TOOL_CHOICE_REQUIRED, NULL, seed ? 1.0f : 0.0f,
					 (uint64_t) seed, text, sizeof(text));
		n_calls++;
		n_valid += f == CAI_FINISH_STOP && call_is_valid(text, synth_tools, NULL);
		CHECK_MSG(f == CAI_FINISH_STOP && call_is_valid(text, synth_tools, NULL),
				  "required, seed %d: finish %d, %s", seed, (int) f, text);
		f = generate(engine, model, tools, CAI_TOOL_CHOICE_NAMED, named, seed ? 1.0f : 0.0f,
					 (uint64_t) seed, text, sizeof(text));
		n_calls++;
		n_valid += f == CAI_FINISH_STOP && call_is_valid(text, synth_tools, named);
		CHECK_MSG(f == CAI_FINISH_STOP && call_is_valid(text, synth_tools, named),
				  "named %s, seed %d: finish %d, %s", named, seed, (int) f, text);
		f = generate(engine, model, tools, CAI_TOOL_CHOICE_AUTO, NULL, 1.0f, (uint64_t) seed,
					 text, sizeof(text));
		if (strncmp(text, "<tool_call>", 11) == 0 || text[0] == '<')
			CHECK_MSG(f == CAI_FINISH_STOP && call_is_valid(text, synth_tools, NULL),
					  "auto, seed %d: a started call must be valid: %s", seed, text);
	}
	CHECK_EQ_INT(n_valid, n_calls);
done:
	cai_engine_free(engine);
	cai_tool_set_free(tools);
	cai_model_free(model);
}
