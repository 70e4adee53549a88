/*
 * tool_eval.c — the tool-call test set on a real model: every tool of a declaration file
 * (tests/tools/tools.json: 30 tools) called by name with three seeds (greedy, then two sampled
 * at temperature 0.8), the prompt offering the tool among its group of GROUP tools (all 30 in
 * one prompt make a 3000-token context that a loaded CPU decodes slowly); each call is read back and its
 * arguments validated against its tool's schema by json_validate.h, a validator that shares
 * nothing with the grammar engine but the JSON parser.
 *
 *   tool_eval MODEL.gguf TOOLS.json [N_TOOLS]
 *
 * Prints one line per call and the counts; exits 1 unless every call is valid.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cai.h"
#include "json.h"
#include "json_validate.h"

#define GROUP 6

/* The declarations [first, first + n) of the array as a tool set. */
static cai_tool_set *
group_tools(const json_value *arr, int first, int n)
{
	cai_buf		b = {0};
	cai_tool_set *set = NULL;
	cai_error	err;
	bool		ok = cai_buf_append(&b, "[", 1);

	for (int i = first; ok && i < first + n && i < (int) arr->u.array.n; i++)
		ok = (i == first || cai_buf_append(&b, ",", 1)) && json_serialize(arr->u.array.items[i], &b);
	if (ok && cai_buf_append(&b, "]", 1) && cai_tool_set_parse(b.data, b.len, &set, &err) != CAI_OK)
		fprintf(stderr, "group: %s\n", err.message);
	cai_buf_free(&b);
	return set;
}

static char *
read_file(const char *path)
{
	FILE	   *f = fopen(path, "rb");
	char	   *s;
	long		n;

	if (!f)
		return NULL;
	fseek(f, 0, SEEK_END);
	n = ftell(f);
	fseek(f, 0, SEEK_SET);
	s = malloc((size_t) n + 1);
	if (s && fread(s, 1, (size_t) n, f) != (size_t) n)
	{
		free(s);
		s = NULL;
	}
	if (s)
		s[n] = '\0';
	fclose(f);
	return s;
}

/* Runs one request to its end; its text in text (cap bytes). */
static cai_finish_reason
run(cai_engine *engine, const cai_request_params *p, char *text, size_t cap, int *n_tokens)
{
	cai_error	err;
	uint64_t	id;
	size_t		len = 0;
	cai_finish_reason finish = CAI_FINISH_NONE;

	text[0] = '\0';
	*n_tokens = 0;
	if (cai_engine_submit(engine, p, &id, &err) != CAI_OK)
	{
		fprintf(stderr, "submit: %s\n", err.message);
		return CAI_FINISH_ERROR;
	}
	while (finish == CAI_FINISH_NONE)
	{
		const cai_event *ev;
		int			n_ev;

		if (cai_engine_step(engine, &ev, &n_ev, &err) != CAI_OK)
			return CAI_FINISH_ERROR;
		for (int i = 0; i < n_ev; i++)
		{
			*n_tokens += ev[i].token >= 0;
			if (len + ev[i].text_len < cap)
			{
				memcpy(text + len, ev[i].text, ev[i].text_len);
				len += ev[i].text_len;
				text[len] = '\0';
			}
			finish = ev[i].finish;
		}
	}
	return finish;
}

/* Whether the reply is a call of name whose arguments validate against params. */
static bool
valid_call(const char *text, const char *name, const json_value *params)
{
	char	   *got = NULL,
			   *args = NULL;
	json_doc   *inst = NULL;
	cai_error	err;
	bool		ok;

	if (cai_tool_reply_parse(text, strlen(text), &got, &args, &err) != CAI_OK)
		return false;
	ok = strcmp(got, name) == 0 && json_parse(args, strlen(args), 0, &inst, &err) == CAI_OK &&
		jv_validate(params, params, json_doc_root(inst), 0);
	json_doc_free(inst);
	free(got);
	free(args);
	return ok;
}

int
main(int argc, char **argv)
{
	static const float temps[3] = {0.0f, 0.8f, 0.8f};
	char	   *tools_json = argc > 2 ? read_file(argv[2]) : NULL;
	json_doc   *doc = NULL;
	cai_tool_set *tools = NULL;
	cai_model  *model = NULL;
	cai_engine *engine = NULL;
	cai_model_params mp;
	cai_engine_params ep;
	cai_error	err;
	int			n_tools,
				counts[4] = {0};	/* valid, invalid, cut, error */
	static char text[16384];

	if (!tools_json)
	{
		fprintf(stderr, "usage: tool_eval MODEL.gguf TOOLS.json [N_TOOLS]\n");
		return 2;
	}
	if (json_parse(tools_json, strlen(tools_json), 0, &doc, &err) != CAI_OK ||
		cai_tool_set_parse(tools_json, strlen(tools_json), &tools, &err) != CAI_OK)
	{
		fprintf(stderr, "%s: %s\n", argv[2], err.message);
		return 2;
	}
	cai_model_params_default(&mp);
	cai_engine_params_default(&ep);
	ep.device = "cpu";
	ep.context_length = 8192;
	ep.host_cache_bytes = (size_t) 1 << 30;	/* the tools' system prompt is prefilled once */
	if (cai_model_load(argv[1], &mp, &model, &err) != CAI_OK ||
		cai_engine_create(model, &ep, &engine, &err) != CAI_OK)
	{
		fprintf(stderr, "%s: %s\n", argv[1], err.message);
		return 2;
	}
	n_tools = cai_tool_set_count(tools);
	if (argc > 3 && atoi(argv[3]) > 0 && atoi(argv[3]) < n_tools)
		n_tools = atoi(argv[3]);
	for (int t = 0; t < n_tools; t++)
	{
		const json_value *fn = json_object_get(json_doc_root(doc)->u.array.items[t], "function");
		const char *name = json_object_get(fn, "name")->u.string.bytes;
		const char *desc = json_object_get(fn, "description")->u.string.bytes;
		char		ask[512];
		cai_chat_message msg = {CAI_ROLE_USER, ask, NULL, 0, NULL};
		cai_tool_set *group = group_tools(json_doc_root(doc), t / GROUP * GROUP, GROUP);
		cai_prompt_params pp = {.add_generation_prompt = true, .tools = group};
		cai_prompt	prompt;

		snprintf(ask, sizeof(ask), "Please use %s (%s) with example arguments.", name, desc);
		if (cai_chat_build_prompt(model, &msg, 1, &pp, &prompt, &err) != CAI_OK)
		{
			fprintf(stderr, "prompt: %s\n", err.message);
			return 2;
		}
		for (int s = 0; s < 3; s++)
		{
			cai_request_params p;
			cai_finish_reason f;
			int			n_tokens;
			int			outcome;

			memset(&p, 0, sizeof(p));
			p.prompt = prompt.ids;
			p.n_prompt = prompt.n_ids;
			p.use_cache = true;
			cai_sampling_params_default(&p.sampling);
			p.sampling.temperature = temps[s];
			p.sampling.seed = (uint64_t) s;
			p.sampling.max_tokens = 384;
			p.tools = group;
			p.tool_choice = CAI_TOOL_CHOICE_NAMED;
			p.tool_name = name;
			f = run(engine, &p, text, sizeof(text), &n_tokens);
			outcome = f == CAI_FINISH_ERROR ? 3 : f == CAI_FINISH_LENGTH ? 2 :
				valid_call(text, name, json_object_get(fn, "parameters")) ? 0 : 1;
			counts[outcome]++;
			for (char *c = text; *c; c++)
				*c = *c == '\n' ? ' ' : *c;
			printf("%-18s seed %d %-7s %3d tokens  %s\n", name, s,
				   (const char *[]) {"valid", "INVALID", "CUT", "ERROR"}[outcome], n_tokens, text);
			fflush(stdout);
		}
		cai_prompt_free(&prompt);
		cai_tool_set_free(group);
	}
	printf("%s: %d calls: %d valid, %d invalid, %d cut by max_tokens, %d errors\n", argv[1],
		   n_tools * 3, counts[0], counts[1], counts[2], counts[3]);
	cai_engine_free(engine);
	cai_model_free(model);
	cai_tool_set_free(tools);
	json_doc_free(doc);
	free(tools_json);
	return counts[0] == n_tools * 3 ? 0 : 1;
}
