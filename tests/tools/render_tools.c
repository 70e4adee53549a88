/*
 * render_tools.c — the prompt ids of a tool-bearing conversation as pg_cai renders it, for
 * compare_jinja.py to set beside llama.cpp's tokenization of the published Jinja template.
 *
 *   render_tools VOCAB.gguf TEMPLATE.jinja TOOLS.json
 *
 * The tokenizer comes from VOCAB.gguf (llama.cpp's vocabulary-only files do), the format is
 * detected from TEMPLATE.jinja as from a GGUF's tokenizer.chat_template.  The conversation is
 * compare_jinja.py's: a system prompt, a user question, an assistant call, two tool results,
 * then the generation prompt.  Prints the ids on one line.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat_template.h"
#include "gguf.h"
#include "tokenizer.h"

static char *
read_file(const char *path)
{
	FILE	   *f = fopen(path, "rb");
	char	   *s = NULL;
	long		n;

	if (!f)
		return NULL;
	fseek(f, 0, SEEK_END);
	n = ftell(f);
	fseek(f, 0, SEEK_SET);
	s = malloc((size_t) n + 1);
	if (s && fread(s, 1, (size_t) n, f) == (size_t) n)
		s[n] = '\0';
	fclose(f);
	return s;
}

int
main(int argc, char **argv)
{
	static const char calls[] = "[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}]";
	cai_chat_message msgs[] = {
		{CAI_ROLE_SYSTEM, "Be brief.", NULL, 0, NULL},
		{CAI_ROLE_USER, "Weather in Paris?", NULL, 0, NULL},
		{CAI_ROLE_ASSISTANT, "", NULL, 0, calls},
		{CAI_ROLE_TOOL, "{\"temp\": 18}", NULL, 0, NULL},
		{CAI_ROLE_TOOL, "sunny", NULL, 0, NULL},
	};
	gguf_file  *gguf = NULL;
	cai_tokenizer *tok = NULL;
	cai_tool_set *tools = NULL;
	cai_chat_template tmpl;
	cai_tokens	t;
	cai_error	err;
	char	   *jinja = argc > 3 ? read_file(argv[2]) : NULL;
	char	   *tools_json = argc > 3 ? read_file(argv[3]) : NULL;

	if (!jinja || !tools_json)
	{
		fprintf(stderr, "usage: render_tools VOCAB.gguf TEMPLATE.jinja TOOLS.json\n");
		return 2;
	}
	cai_tokens_init(&t);
	if (gguf_open(argv[1], &gguf, &err) != CAI_OK || cai_tokenizer_load(gguf, &tok, &err) != CAI_OK ||
		cai_tool_set_parse(tools_json, strlen(tools_json), &tools, &err) != CAI_OK ||
		cai_chat_template_detect(jinja, NULL, tok, &tmpl, &err) != CAI_OK ||
		cai_chat_template_render_tools(&tmpl, tok, msgs, 5, tools, true, &t, NULL, &err) != CAI_OK)
	{
		fprintf(stderr, "render_tools: %s\n", err.message);
		return 1;
	}
	for (int i = 0; i < t.n; i++)
		printf(i ? " %d" : "%d", t.ids[i]);
	printf("\n");
	cai_tokens_free(&t);
	cai_tool_set_free(tools);
	cai_tokenizer_free(tok);
	gguf_close(gguf);
	free(jinja);
	free(tools_json);
	return 0;
}
