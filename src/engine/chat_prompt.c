/*
 * chat_prompt.c — a conversation rendered into prompt tokens with the model's chat template
 * (chat_template.c), dropping the oldest turns to fit a token budget.
 */
#include "model.h"

#include <stdlib.h>
#include <string.h>

#include "util.h"

/* Frees a prompt's arrays and zeroes it (NULL is fine). */
void
cai_prompt_free(cai_prompt *prompt)
{
	if (!prompt)
		return;
	free(prompt->ids);
	free(prompt->last_content_ids);
	memset(prompt, 0, sizeof(*prompt));
}

/*
 * Renders messages[i] for i in keep order: every system message, and the non-system messages
 * from index first on.
 */
static cai_status
render_kept(const cai_model *model, const cai_chat_message *msgs, int n, int first,
			bool add_generation_prompt, cai_chat_message *kept, int32_t (*spans)[2],
			int *n_kept_out, cai_tokens *out, cai_error *err)
{
	int			n_kept = 0;

	for (int i = 0; i < n; i++)
		if (msgs[i].role == CAI_ROLE_SYSTEM || i >= first)
			kept[n_kept++] = msgs[i];
	out->n = 0;
	*n_kept_out = n_kept;
	return cai_chat_template_render_spans(&model->tmpl, model->tokenizer, kept, n_kept,
										  add_generation_prompt, out, spans, err);
}

/*
 * Renders the conversation with the model's template.  Contents are tokenized once (plain text,
 * no special tokens) and spliced as ids, like stored turns.  Over max_prompt_tokens, the oldest
 * non-system messages are dropped (never the last one, and never leaving an assistant reply
 * first) until it fits; first_message is then the first message kept besides system ones.
 */
cai_status
cai_chat_build_prompt(const cai_model *model, const cai_chat_message *messages, int n_messages,
					  const cai_prompt_params *params, cai_prompt *out, cai_error *err)
{
	cai_prompt_params defaults = {.add_generation_prompt = true, .max_prompt_tokens = 0,
	.truncate = true};
	cai_chat_message *msgs = NULL;
	cai_chat_message *kept = NULL;
	int32_t   (*spans)[2] = NULL;
	int			n_kept = 0;
	cai_tokens	rendered;
	int			n_vocab = model->cfg.n_vocab;
	int			first = 0;
	cai_status	st = CAI_OK;

	memset(out, 0, sizeof(*out));
	cai_tokens_init(&rendered);
	if (!params)
		params = &defaults;
	if (n_messages < 1 || !messages)
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT, "a chat prompt needs at least one message");
	if (params->max_prompt_tokens < 0)
		return cai_fail(err, CAI_ERR_INVALID_ARGUMENT, "max_prompt_tokens must not be negative");

	msgs = malloc((size_t) n_messages * sizeof(cai_chat_message));
	kept = malloc((size_t) n_messages * sizeof(cai_chat_message));
	spans = malloc((size_t) n_messages * sizeof(*spans));
	if (!msgs || !kept || !spans)
	{
		st = cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory building the prompt");
		goto done;
	}

	/*
	 * Validate; contents without stored ids are tokenized by the renderer, as the format does it
	 * (trimming, SentencePiece spaces), and the last one's ids are read back from its span.
	 */
	for (int i = 0; i < n_messages; i++)
	{
		const cai_chat_message *m = &messages[i];

		msgs[i] = *m;
		if (m->role != CAI_ROLE_SYSTEM && m->role != CAI_ROLE_USER && m->role != CAI_ROLE_ASSISTANT)
		{
			st = cai_fail(err, CAI_ERR_INVALID_ARGUMENT, "message %d has an unknown role %d", i,
						  (int) m->role);
			goto done;
		}
		if (m->tokens)
		{
			if (m->n_tokens < 0)
			{
				st = cai_fail(err, CAI_ERR_INVALID_ARGUMENT, "message %d has a negative token count", i);
				goto done;
			}
			for (int j = 0; j < m->n_tokens; j++)
				if (m->tokens[j] < 0 || m->tokens[j] >= n_vocab)
				{
					st = cai_fail(err, CAI_ERR_INVALID_ARGUMENT,
								  "message %d holds token id %d, outside the vocabulary", i,
								  m->tokens[j]);
					goto done;
				}
			continue;
		}
		if (!m->content)
		{
			st = cai_fail(err, CAI_ERR_INVALID_ARGUMENT, "message %d has neither content nor tokens", i);
			goto done;
		}
	}

	/* render; while too long, drop the oldest non-system message (never the last) */
	for (;;)
	{
		int			next;

		if ((st = render_kept(model, msgs, n_messages, first, params->add_generation_prompt, kept,
							  spans, &n_kept, &rendered, err)) != CAI_OK)
			goto done;
		if (params->max_prompt_tokens == 0 || rendered.n <= params->max_prompt_tokens)
			break;
		if (!params->truncate)
		{
			st = cai_fail(err, CAI_ERR_CONTEXT_FULL,
						  "the prompt is %d tokens, more than the limit of %d", rendered.n,
						  params->max_prompt_tokens);
			goto done;
		}
		/* the oldest kept non-system message before the last one */
		next = first;
		while (next < n_messages - 1 && msgs[next].role == CAI_ROLE_SYSTEM)
			next++;
		if (next >= n_messages - 1)
		{
			st = cai_fail(err, CAI_ERR_CONTEXT_FULL,
						  "the last message needs %d prompt tokens (with the system prompt and "
						  "the template), more than the limit of %d", rendered.n,
						  params->max_prompt_tokens);
			goto done;
		}
		first = next + 1;
		/* a kept history should start with a user turn, not an orphaned reply */
		while (first < n_messages - 1 && msgs[first].role == CAI_ROLE_ASSISTANT)
			first++;
	}

	/* messages [first, n) are all kept; earlier ones only when they are system messages */
	out->first_message = first;
	{
		/* the last message is always kept, so it is the last rendered one */
		int32_t		start = spans[n_kept - 1][0];
		int32_t		end = spans[n_kept - 1][1];

		out->n_last_content_ids = start >= 0 ? end - start : 0;
		out->last_content_ids = malloc(((size_t) out->n_last_content_ids + 1) * sizeof(int32_t));
		if (!out->last_content_ids)
		{
			st = cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory building the prompt");
			goto done;
		}
		if (out->n_last_content_ids > 0)
			memcpy(out->last_content_ids, rendered.ids + start,
				   (size_t) out->n_last_content_ids * sizeof(int32_t));
	}
	out->ids = rendered.ids;
	out->n_ids = rendered.n;
	cai_tokens_init(&rendered);

done:
	if (st != CAI_OK)
		cai_prompt_free(out);
	cai_tokens_free(&rendered);
	free(spans);
	free(kept);
	free(msgs);
	return st;
}
