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
			bool add_generation_prompt, const cai_tool_set *tools, cai_chat_message *kept,
			int32_t (*spans)[2], int *n_kept_out, cai_tokens *out, cai_error *err)
{
	int			n_kept = 0;

	for (int i = 0; i < n; i++)
		if (msgs[i].role == CAI_ROLE_SYSTEM || i >= first)
			kept[n_kept++] = msgs[i];
	out->n = 0;
	*n_kept_out = n_kept;
	return cai_chat_template_render_tools(&model->tmpl, model->tokenizer, kept, n_kept, tools,
										  add_generation_prompt, out, spans, err);
}

/*
 * Truncation with hysteresis.  Dropping just enough of the oldest turns to fit would drop one
 * more every turn once a conversation is past the context: every prompt would start differently
 * from the last one, and the prefix cache would serve only the system prompt.  Instead, when the
 * history overflows, turns are dropped until what is kept takes at most half the budget, and that
 * cut stays while the history grows, until it overflows again.
 *
 * The cut is not remembered anywhere (the engine restarts; a conversation's turns may go to
 * another node): it is derived from the history alone, by replaying the requests that built it.
 * Each earlier request was the messages up to one of its user messages (a checkpoint); starting
 * with nothing cut, the cut moves only at a checkpoint whose prompt from the current cut overflows,
 * and then to the first turn from which that prompt takes at most half the budget.  The same
 * history thus always gives the same cut, and consecutive turns share it until it must move.
 */
typedef struct history_fit
{
	const cai_model *model;
	const cai_chat_message *msgs;
	int			n;
	bool		add_generation_prompt;
	cai_chat_message *kept;		/* scratch for render_kept */
	int32_t   (*spans)[2];
	cai_tokens *scratch;
	int		   *candidates;		/* scratch: message indices */
	cai_error  *err;
	const cai_tool_set *tools;
} history_fit;

/* Prompt tokens of the request ending at message last with the history cut at first. */
static cai_status
kept_length(history_fit *f, int first, int last, int *length)
{
	int			n_kept;
	cai_status	st = render_kept(f->model, f->msgs, last + 1, first, f->add_generation_prompt,
								 f->tools, f->kept, f->spans, &n_kept, f->scratch, f->err);

	*length = f->scratch->n;
	return st;
}

/*
 * The new cut for the request ending at message last, whose prompt from cut overflows budget:
 * the first turn after cut from which the prompt takes at most half the budget, else at most
 * the budget, else last itself (nothing fits: that request failed, or this one will).  A kept
 * history starts with a user turn (or the last message), never an orphaned reply.  The prompt
 * only shrinks as the cut moves later, so the first fitting turn is found by bisection.
 */
static cai_status
next_cut(history_fit *f, int cut, int last, int budget, int *out)
{
	int			n_candidates = 0;
	int			limits[2] = {budget / 2, budget};

	for (int k = cut + 1; k <= last; k++)
		if (k == last || f->msgs[k].role == CAI_ROLE_USER)
			f->candidates[n_candidates++] = k;
	*out = last;
	for (int l = 0; l < 2; l++)
	{
		int			lo = 0,
					hi = n_candidates - 1,
					length;
		cai_status	st;

		/* the last candidate is the last message: when even it is over the limit, none fits */
		if ((st = kept_length(f, f->candidates[hi], last, &length)) != CAI_OK)
			return st;
		if (length > limits[l])
			continue;
		while (lo < hi)
		{
			int			mid = lo + (hi - lo) / 2;

			if ((st = kept_length(f, f->candidates[mid], last, &length)) != CAI_OK)
				return st;
			if (length <= limits[l])
				hi = mid;
			else
				lo = mid + 1;
		}
		*out = f->candidates[lo];
		return CAI_OK;
	}
	return CAI_OK;
}

/*
 * The cut for the whole history (the current request is its last message), which overflows
 * budget uncut: the replay described above.  Checkpoints are the user messages and the last
 * message; the prompt grows with the checkpoint, so each overflow is found by bisection.
 */
static cai_status
choose_cut(history_fit *f, int budget, int *cut_out)
{
	int		   *checkpoints;
	int			n_checkpoints = 0;
	int			cut = 0;
	int			from = 0;
	cai_status	st = CAI_OK;

	checkpoints = malloc((size_t) f->n * sizeof(int));
	if (!checkpoints)
		return cai_fail(f->err, CAI_ERR_NO_MEMORY, "out of memory building the prompt");
	while (cut < f->n - 1 && f->msgs[cut].role == CAI_ROLE_SYSTEM)
		cut++;
	for (int i = cut; i < f->n; i++)
		if (i == f->n - 1 || f->msgs[i].role == CAI_ROLE_USER)
			checkpoints[n_checkpoints++] = i;

	while (from < n_checkpoints)
	{
		int			lo = from,
					hi = from,
					length;

		/*
		 * The first checkpoint from here whose prompt overflows, found by galloping from here
		 * and then bisecting: each probe renders from the cut to the probe, so probing close to
		 * the cut first keeps the work near a context's worth of turns per overflow, where
		 * bisecting the whole remaining history would render all of it every time.
		 */
		for (;;)
		{
			if ((st = kept_length(f, cut, checkpoints[hi], &length)) != CAI_OK)
				goto done;
			if (length > budget)
				break;
			if (hi == n_checkpoints - 1)
				goto done;		/* the whole history fits from the cut */
			lo = hi + 1;
			hi = from + 2 * (hi - from + 1);
			if (hi > n_checkpoints - 1)
				hi = n_checkpoints - 1;
		}
		while (lo < hi)
		{
			int			mid = lo + (hi - lo) / 2;

			if ((st = kept_length(f, cut, checkpoints[mid], &length)) != CAI_OK)
				goto done;
			if (length > budget)
				hi = mid;
			else
				lo = mid + 1;
		}
		if (checkpoints[lo] == cut)
			from = lo + 1;		/* that request's only turn did not fit: it failed */
		else
		{
			if ((st = next_cut(f, cut, checkpoints[lo], budget, &cut)) != CAI_OK)
				break;
			from = lo + 1;
		}
	}
done:
	free(checkpoints);
	*cut_out = cut;
	return st;
}

/*
 * Renders the conversation with the model's template.  Contents are tokenized once (plain text,
 * no special tokens) and spliced as ids, like stored turns.  Over max_prompt_tokens, the oldest
 * non-system messages are dropped (never the last one, and never leaving an assistant reply
 * first) with hysteresis (choose_cut); first_message is then the first message kept besides
 * system ones.
 */
cai_status
cai_chat_build_prompt(const cai_model *model, const cai_chat_message *messages, int n_messages,
					  const cai_prompt_params *params, cai_prompt *out, cai_error *err)
{
	cai_prompt_params defaults = {.add_generation_prompt = true, .max_prompt_tokens = 0,
	.truncate = true};
	cai_chat_message *msgs = NULL;
	cai_chat_message *kept = NULL;
	cai_chat_message *fit_msgs = NULL;
	int32_t    *memo_ids = NULL;
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
		if (m->role != CAI_ROLE_SYSTEM && m->role != CAI_ROLE_USER &&
			m->role != CAI_ROLE_ASSISTANT && m->role != CAI_ROLE_TOOL)
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

	/* render everything; when too long, cut the history (choose_cut) and render what is kept */
	if ((st = render_kept(model, msgs, n_messages, first, params->add_generation_prompt,
						  params->tools, kept,
						  spans, &n_kept, &rendered, err)) != CAI_OK)
		goto done;
	if (params->max_prompt_tokens > 0 && rendered.n > params->max_prompt_tokens)
	{
		history_fit fit = {model, msgs, n_messages, params->add_generation_prompt, kept, spans,
		&rendered, NULL, err, params->tools};

		if (!params->truncate)
		{
			st = cai_fail(err, CAI_ERR_CONTEXT_FULL,
						  "the prompt is %d tokens, more than the limit of %d", rendered.n,
						  params->max_prompt_tokens);
			goto done;
		}
		fit.candidates = malloc((size_t) n_messages * sizeof(int));
		fit_msgs = malloc((size_t) n_messages * sizeof(cai_chat_message));
		memo_ids = malloc(((size_t) rendered.n + 1) * sizeof(int32_t));
		if (!fit.candidates || !fit_msgs || !memo_ids)
		{
			free(fit.candidates);
			st = cai_fail(err, CAI_ERR_NO_MEMORY, "out of memory building the prompt");
			goto done;
		}

		/*
		 * choose_cut renders parts of the history again and again: each content is tokenized
		 * once, here, and its ids from the full rendering stand in for it.  A content's ids can
		 * differ by its neighbours (a SentencePiece space at a fresh start), so these renders
		 * only measure; the prompt itself is rendered from the messages as given.
		 */
		memcpy(memo_ids, rendered.ids, (size_t) rendered.n * sizeof(int32_t));
		for (int i = 0; i < n_messages; i++)
		{
			fit_msgs[i] = msgs[i];
			if (!msgs[i].tokens && spans[i][0] >= 0 && spans[i][1] >= spans[i][0])
			{
				fit_msgs[i].tokens = memo_ids + spans[i][0];
				fit_msgs[i].n_tokens = spans[i][1] - spans[i][0];
			}
		}
		fit.msgs = fit_msgs;
		st = choose_cut(&fit, params->max_prompt_tokens, &first);
		free(fit.candidates);
		if (st != CAI_OK ||
			(st = render_kept(model, msgs, n_messages, first, params->add_generation_prompt,
							  params->tools, kept, spans, &n_kept, &rendered, err)) != CAI_OK)
			goto done;
		if (rendered.n > params->max_prompt_tokens)
		{
			st = cai_fail(err, CAI_ERR_CONTEXT_FULL,
						  "the last message needs %d prompt tokens (with the system prompt and "
						  "the template), more than the limit of %d", rendered.n,
						  params->max_prompt_tokens);
			goto done;
		}
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
	free(memo_ids);
	free(fit_msgs);
	free(spans);
	free(kept);
	free(msgs);
	return st;
}
