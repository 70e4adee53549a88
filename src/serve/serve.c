/*
 * serve.c — the engine process's loop: frames in, engine steps, frames out (see serve.h).
 *
 * Heartbeats prove that this loop turns, so they come from the loop itself, between steps and
 * while idle, never from a thread of their own: a stopped process, a deadlocked or endless step
 * and a stuck device all silence them, and the worker kills an engine silent for longer than
 * pg_cai.engine_hang_timeout.  The price is that one step is one unit: the timeout must exceed
 * the longest step.  Decoding one request (its template and tokens) is such a unit too, between
 * which heartbeats go out; its size is bounded where it is made (pg_cai.max_request_bytes and
 * max_request_messages).  Each heartbeat carries the longest unit so far, which the worker
 * compares with the timeout.  Before the loop, while the model loads, load_watch.c's thread
 * sends them as long as the load makes progress.
 */
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "load_watch.h"
#include "request_decode.h"
#include "serve.h"
#include "util.h"
#include "wire.h"

/* STATS frames while busy go out at most this often */
#define STATS_INTERVAL_SECONDS 0.1
/* input is read in pieces of this size */
#define READ_CHUNK (64 * 1024)

/* One sample of a generation: what was sent of its reply */
typedef struct serve_sample
{
	cai_wbuf	text;			/* the reply's text sent so far */
	cai_tokens	generated;		/* generated ids, end-of-turn tokens excluded */
} serve_sample;

/* A generation the engine is running for the worker */
typedef struct serve_request
{
	uint64_t	id;				/* the worker's id for it */
	uint64_t	engine_id;
	int			n_samples;
	int			n_ended;		/* samples finished */
	int			current_sample; /* the one the last SAMPLE message named (-1: none yet) */
	cai_wire_final total;		/* the samples' usage, summed as they end */
	serve_sample samples[CAI_N_SAMPLES_MAX];
	int32_t    *user_tokens;	/* CHAT: the last turn's content ids */
	int			n_user_tokens;
	int			first_message;

	/*
	 * EMBED: every text is an engine request of its own, submitted a batch's worth at a time
	 * (the engine's queue stays open to the others); the vectors collect here until the last.
	 */
	bool		embed;
	int			n_texts;
	int32_t   **text_ids;		/* owned, from the decoded request */
	int		   *text_n_ids;
	int			next_text;		/* the first not yet submitted */
	int			n_running;		/* submitted, not finished */
	int			n_done;
	uint64_t   *text_engine_id; /* [n_texts] while submitted */
	float	   *vectors;		/* [n_texts * dim] */
	int			dim;
	int			prompt_tokens;
	struct serve_request *prev;
	struct serve_request *next;
} serve_request;

typedef struct server
{
	int			fd;
	cai_model  *model;
	cai_engine *engine;
	cai_model_info info;
	int			context_length;

	char	   *in;				/* bytes read, not yet parsed */
	size_t		in_len;
	size_t		in_cap;
	cai_wbuf	out;			/* frames to send */
	cai_wbuf	step_out;		/* one step's MESSAGE frames, sent after its STATS */
	bool		closed;			/* the worker closed its end, or the socket failed */
	bool		broken;			/* the worker sent what no worker may send */

	serve_request *requests;
	double		last_stats;
	double		last_heartbeat;
	double		longest_step;	/* seconds */
	int			max_running;	/* the engine's batch: an embedding's texts in flight at most */
	bool		stats_due;		/* the statistics changed outside a step (cancel, refusal) */
	bool		weights_cache_pending;	/* its file is being written: say so when it ends */
} server;

/* ---------------------------------------------------------------------------------------------
 * Output
 * ------------------------------------------------------------------------------------------- */

/* Sends every queued frame, waiting for the socket as needed. */
static void
flush_output(server *s)
{
	size_t		sent = 0;

	if (s->out.failed)
	{
		/* a frame could not be built (out of memory): the stream can no longer be trusted */
		s->closed = true;
		s->broken = true;
	}
	while (!s->closed && sent < s->out.len)
	{
		ssize_t		n = send(s->fd, s->out.data + sent, s->out.len - sent, MSG_NOSIGNAL);

		if (n > 0)
			sent += (size_t) n;
		else if (n < 0 && errno == EINTR)
			continue;
		else
			s->closed = true;	/* EPIPE, ECONNRESET: the worker is gone */
	}
	cai_wbuf_reset(&s->out);
}

/* Queues a response message of type with a body in two parts (either may be empty). */
static void
send_message(cai_wbuf *w, uint64_t id, char type, const void *body, size_t body_len,
			 const void *tail, size_t tail_len)
{
	size_t		frame = cai_frame_begin(w, CAI_FRAME_MESSAGE, id);

	cai_put_u8(w, (uint8_t) type);
	cai_put_bytes(w, body, body_len);
	cai_put_bytes(w, tail, tail_len);
	cai_frame_end(w, frame);
}

static void
send_error(cai_wbuf *w, uint64_t id, cai_status status, const char *message)
{
	size_t		frame = cai_frame_begin(w, CAI_FRAME_MESSAGE, id);

	cai_put_u8(w, CAI_MSG_ERROR);
	cai_wire_put_error(w, (int32_t) status, message);
	cai_frame_end(w, frame);
}

/* A line for the server log. */
static void
send_log(server *s, const char *fmt,...) __attribute__((format(printf, 2, 3)));

static void
send_log(server *s, const char *fmt,...)
{
	char		line[CAI_ERROR_MESSAGE_SIZE];
	va_list		args;
	size_t		frame;

	va_start(args, fmt);
	vsnprintf(line, sizeof(line), fmt, args);
	va_end(args);
	frame = cai_frame_begin(&s->out, CAI_FRAME_LOG, 0);
	cai_put_text(&s->out, line, strlen(line));
	cai_frame_end(&s->out, frame);
}

static void
send_stats(server *s)
{
	cai_engine_stats stats;
	size_t		frame;

	cai_engine_get_stats(s->engine, &stats);
	frame = cai_frame_begin(&s->out, CAI_FRAME_STATS, 0);
	cai_wire_put_stats(&s->out, &stats);
	cai_frame_end(&s->out, frame);
	s->last_stats = cai_now_seconds();
}

/* Says the loop is alive, when the last heartbeat is CAI_HEARTBEAT_INTERVAL_MS old. */
static void
send_heartbeat_if_due(server *s)
{
	double		now = cai_now_seconds();
	size_t		frame;

	if ((now - s->last_heartbeat) * 1000.0 < CAI_HEARTBEAT_INTERVAL_MS)
		return;
	frame = cai_frame_begin(&s->out, CAI_FRAME_HEARTBEAT, 0);
	cai_put_f64(&s->out, s->longest_step);
	cai_frame_end(&s->out, frame);
	s->last_heartbeat = now;
}

/* How long the idle loop may wait for the worker before the next heartbeat is due. */
static int
idle_wait_ms(const server *s)
{
	double		due = s->last_heartbeat + CAI_HEARTBEAT_INTERVAL_MS / 1000.0;
	double		ms = (due - cai_now_seconds()) * 1000.0;

	return ms < 1.0 ? 1 : (int) ms + 1;
}

/* ---------------------------------------------------------------------------------------------
 * Requests
 * ------------------------------------------------------------------------------------------- */

static void
request_free(serve_request *req)
{
	for (int i = 0; i < req->n_samples; i++)
	{
		cai_wbuf_free(&req->samples[i].text);
		cai_tokens_free(&req->samples[i].generated);
	}
	free(req->user_tokens);
	for (int i = 0; i < req->n_texts; i++)
		free(req->text_ids[i]);
	free(req->text_ids);
	free(req->text_n_ids);
	free(req->text_engine_id);
	free(req->vectors);
	free(req);
}

static void
request_unlink(server *s, serve_request *req)
{
	if (req->prev)
		req->prev->next = req->next;
	else
		s->requests = req->next;
	if (req->next)
		req->next->prev = req->prev;
	request_free(req);
}

/* Whether req (an event's user_data) is still one of the requests served. */
static bool
request_live(const server *s, const serve_request *req)
{
	for (const serve_request *r = s->requests; r; r = r->next)
		if (r == req)
			return true;
	return false;
}

/* Drops whatever the engine still runs for a request (its texts, for an embedding). */
static void
request_cancel_engine(server *s, serve_request *req)
{
	if (!req->embed)
	{
		(void) cai_engine_cancel(s->engine, req->engine_id);
		return;
	}
	for (int i = 0; i < req->next_text; i++)
		if (req->text_engine_id[i] != 0)
			(void) cai_engine_cancel(s->engine, req->text_engine_id[i]);
}

static serve_request *
request_find(server *s, uint64_t id)
{
	for (serve_request *r = s->requests; r; r = r->next)
		if (r->id == id)
			return r;
	return NULL;
}

/* Submits a decoded generation; its events are forwarded by handle_event. */
static void
start_generation(server *s, uint64_t id, cai_decoded_request *dec)
{
	serve_request *req = calloc(1, sizeof(*req));
	cai_error	err;
	cai_status	st;

	if (!req)
	{
		send_error(&s->out, id, CAI_ERR_NO_MEMORY, "out of memory starting the request");
		return;
	}
	req->id = id;
	req->first_message = dec->first_message;
	req->user_tokens = dec->user_tokens;
	req->n_user_tokens = dec->n_user_tokens;
	dec->user_tokens = NULL;
	req->n_samples = dec->params.sampling.n_samples;
	req->current_sample = -1;
	for (int i = 0; i < req->n_samples; i++)
	{
		cai_wbuf_init(&req->samples[i].text, NULL);
		cai_tokens_init(&req->samples[i].generated);
	}

	dec->params.user_data = req;
	st = cai_engine_submit(s->engine, &dec->params, &req->engine_id, &err);
	dec->params.grammar = NULL; /* the engine's now, submitted or not */
	if (st != CAI_OK)
	{
		if (st == CAI_ERR_QUEUE_FULL)
			s->stats_due = true;	/* requests_rejected moved */
		send_error(&s->out, id, st, err.message);
		request_free(req);
		return;
	}
	req->next = s->requests;
	if (s->requests)
		s->requests->prev = req;
	s->requests = req;
}

/*
 * Submits an embedding's next texts while fewer than a batch run; false after an error was
 * sent (the request is then to be dropped).  A full queue only waits for the request's own
 * texts to make room, unless none of them runs.
 */
static bool
embed_submit_more(server *s, serve_request *req, cai_wbuf *out)
{
	while (req->next_text < req->n_texts && req->n_running < s->max_running)
	{
		cai_request_params rp;
		cai_error	err;
		cai_status	st;
		int			i = req->next_text;

		memset(&rp, 0, sizeof(rp));
		rp.prompt = req->text_ids[i];
		rp.n_prompt = req->text_n_ids[i];
		rp.embed = true;
		rp.user_data = req;
		cai_sampling_params_default(&rp.sampling);
		st = cai_engine_submit(s->engine, &rp, &req->text_engine_id[i], &err);
		if (st == CAI_ERR_QUEUE_FULL && req->n_running > 0)
			return true;
		if (st != CAI_OK)
		{
			char		message[CAI_ERROR_MESSAGE_SIZE + 32];

			if (st == CAI_ERR_QUEUE_FULL)
				s->stats_due = true;
			if (req->n_texts > 1)
				snprintf(message, sizeof(message), "text %d: %s", i + 1, err.message);
			else
				snprintf(message, sizeof(message), "%s", err.message);
			request_cancel_engine(s, req);
			send_error(out, req->id, st, message);
			return false;
		}
		req->prompt_tokens += rp.n_prompt;
		req->next_text++;
		req->n_running++;
	}
	return true;
}

/* Starts a decoded embedding: takes its texts over and submits the first of them. */
static void
start_embedding(server *s, uint64_t id, cai_decoded_request *dec)
{
	serve_request *req = calloc(1, sizeof(*req));

	if (req)
	{
		req->text_engine_id = calloc((size_t) dec->n_texts, sizeof(uint64_t));
		req->vectors = malloc(sizeof(float) * (size_t) dec->n_texts * (size_t) s->info.d_model);
	}
	if (!req || !req->text_engine_id || !req->vectors)
	{
		if (req)
		{
			free(req->text_engine_id);
			free(req->vectors);
			free(req);
		}
		send_error(&s->out, id, CAI_ERR_NO_MEMORY, "out of memory starting the request");
		return;
	}
	req->id = id;
	req->embed = true;
	req->dim = s->info.d_model;
	req->n_texts = dec->n_texts;
	req->text_ids = dec->text_ids;
	req->text_n_ids = dec->text_n_ids;
	dec->text_ids = NULL;
	dec->text_n_ids = NULL;
	dec->n_texts = 0;
	req->next = s->requests;
	if (s->requests)
		s->requests->prev = req;
	s->requests = req;
	if (!embed_submit_more(s, req, &s->out))
		request_unlink(s, req);
}

/*
 * One of an embedding's texts finished: its vector is kept, and the last one sends them all.
 * Returns true when the request is over (answered, or failed).
 */
static bool
embed_event(server *s, serve_request *req, const cai_event *ev)
{
	int			i;

	if (ev->finish == CAI_FINISH_NONE)
		return false;
	for (i = 0; i < req->next_text; i++)
		if (req->text_engine_id[i] == ev->request_id)
			break;
	req->n_running--;
	if (ev->finish == CAI_FINISH_ERROR || i == req->next_text || !ev->embedding ||
		ev->n_embedding != req->dim)
	{
		if (i < req->next_text)
			req->text_engine_id[i] = 0;
		request_cancel_engine(s, req);
		send_error(&s->step_out, req->id, CAI_ERR_BACKEND,
				   ev->error ? ev->error : "the embedding failed");
		request_unlink(s, req);
		return true;
	}
	req->text_engine_id[i] = 0;
	memcpy(req->vectors + (size_t) i * req->dim, ev->embedding, sizeof(float) * (size_t) req->dim);
	if (++req->n_done < req->n_texts)
	{
		if (!embed_submit_more(s, req, &s->step_out))
		{
			request_unlink(s, req);
			return true;
		}
		return false;
	}
	{
		size_t		frame = cai_frame_begin(&s->step_out, CAI_FRAME_MESSAGE, req->id);

		cai_put_u8(&s->step_out, CAI_MSG_EMBEDDINGS);
		cai_put_i32(&s->step_out, req->n_texts);
		cai_put_i32(&s->step_out, req->dim);
		cai_put_i32(&s->step_out, req->prompt_tokens);
		for (size_t k = 0; k < (size_t) req->n_texts * req->dim; k++)
			cai_put_f32(&s->step_out, req->vectors[k]);
		cai_frame_end(&s->step_out, frame);
	}
	request_unlink(s, req);
	return true;
}

/* Answers a request: at once, or by submitting it to the engine. */
static void
start_request(server *s, uint64_t id, const char *body, size_t len)
{
	cai_reader	r;
	uint32_t	kind;
	cai_decoded_request dec;
	cai_error	err;
	cai_status	st;

	cai_reader_init(&r, body, len);
	if (!cai_get_u32(&r, &kind))
	{
		send_error(&s->out, id, CAI_ERR_INTERNAL, "malformed request frame");
		return;
	}
	if (request_find(s, id))
	{
		/* a worker never reuses an id while the request runs */
		s->broken = true;
		return;
	}
	st = cai_request_decode(s->model, s->context_length, kind, body + r.pos, len - r.pos, &dec,
							&err);
	if (st != CAI_OK)
	{
		send_error(&s->out, id, st, err.message);
		return;
	}

	switch (dec.kind)
	{
		case CAI_REQUEST_CHAT:
		case CAI_REQUEST_COMPLETE:
			start_generation(s, id, &dec);
			break;

		case CAI_REQUEST_EMBED:
			start_embedding(s, id, &dec);
			break;

		case CAI_REQUEST_TOKENIZE:
			{
				int32_t    *ids = NULL;
				int			n_ids = 0;

				st = cai_tokenize(s->model, dec.text, dec.text_len, false, &ids, &n_ids, &err);
				if (st != CAI_OK)
					send_error(&s->out, id, st, err.message);
				else
				{
					int32_t		count = n_ids;

					send_message(&s->out, id, CAI_MSG_IDS, &count, sizeof(count), ids,
								 sizeof(int32_t) * (size_t) n_ids);
				}
				cai_free(ids);
				break;
			}

		case CAI_REQUEST_DETOKENIZE:
			{
				char	   *text = NULL;
				size_t		text_len = 0;

				st = cai_detokenize(s->model, dec.ids, dec.n_ids, &text, &text_len, &err);
				if (st != CAI_OK)
					send_error(&s->out, id, st, err.message);
				else
					send_message(&s->out, id, CAI_MSG_TEXT, text, text_len, NULL, 0);
				cai_free(text);
				break;
			}

		case CAI_REQUEST_CACHE_RESET:
			cai_engine_cache_reset(s->engine);
			send_stats(s);
			send_message(&s->out, id, CAI_MSG_OK, NULL, 0, NULL, 0);
			break;

		case CAI_REQUEST_CACHE_FORGET:
			cai_engine_cache_forget(s->engine, dec.owner);
			send_stats(s);
			send_message(&s->out, id, CAI_MSG_OK, NULL, 0, NULL, 0);
			break;
	}
	cai_decoded_request_free(&dec);
}

/* True when the token ends a turn and is not part of the content. */
static bool
is_end_token(const server *s, int32_t token)
{
	return token == s->info.eos_token || token == s->info.eot_token;
}

/*
 * Before a message of one sample of a request of several: names the sample when the last
 * message named another.
 */
static void
select_sample(server *s, serve_request *req, int sample)
{
	int32_t		v = sample;

	if (req->n_samples == 1 || req->current_sample == sample)
		return;
	send_message(&s->step_out, req->id, CAI_MSG_SAMPLE, &v, sizeof(v), NULL, 0);
	req->current_sample = sample;
}

/*
 * A sample's end: its usage is added to the request's, and a request of several samples says
 * which ended how (SAMPLE_END).  Stored ids must say exactly what the stored text says, or the
 * next turn would feed the model something else than the conversation shows (a withheld stop
 * string, say): tokens_exact tells.
 */
static void
end_sample(server *s, serve_request *req, const cai_event *ev)
{
	serve_sample *sm = &req->samples[ev->sample];
	cai_wire_final final;
	char	   *text = NULL;
	size_t		len = 0;
	cai_error	err;

	memset(&final, 0, sizeof(final));
	final.finish = ev->finish;
	final.prompt_tokens = ev->usage.prompt_tokens;
	final.cached_tokens = ev->usage.cached_tokens;
	final.completion_tokens = ev->usage.completion_tokens;
	final.queue_ms = ev->usage.queue_ms;
	final.ttft_ms = ev->usage.ttft_ms;
	final.total_ms = ev->usage.total_ms;
	if (cai_detokenize(s->model, sm->generated.ids, sm->generated.n, &text, &len, &err) == CAI_OK)
	{
		final.tokens_exact = !sm->text.failed && len == sm->text.len &&
			(len == 0 || memcmp(text, sm->text.data, len) == 0);
		cai_free(text);
	}
	if (req->n_ended++ == 0)
		req->total = final;
	else
	{
		/* OpenAI's usage of n choices: the prompt once, every choice's completion */
		req->total.completion_tokens += final.completion_tokens;
		req->total.tokens_exact &= final.tokens_exact;
		if (final.ttft_ms < req->total.ttft_ms)
			req->total.ttft_ms = final.ttft_ms;
		if (final.total_ms > req->total.total_ms)
			req->total.total_ms = final.total_ms;
	}
	if (ev->sample == 0)
		req->total.finish = final.finish;
	if (req->n_samples > 1)
	{
		size_t		frame;

		select_sample(s, req, ev->sample);
		frame = cai_frame_begin(&s->step_out, CAI_FRAME_MESSAGE, req->id);
		cai_put_u8(&s->step_out, CAI_MSG_SAMPLE_END);
		cai_wire_put_final(&s->step_out, &final);
		cai_frame_end(&s->step_out, frame);
	}
}

/* The FINAL message of a generation, once every sample ended: usage and the ids to store. */
static void
finish_generation(server *s, serve_request *req)
{
	size_t		frame;

	req->total.first_message = req->first_message;
	req->total.n_user_tokens = req->n_user_tokens;
	frame = cai_frame_begin(&s->step_out, CAI_FRAME_MESSAGE, req->id);
	cai_put_u8(&s->step_out, CAI_MSG_FINAL);
	cai_wire_put_final(&s->step_out, &req->total);
	cai_put_bytes(&s->step_out, req->user_tokens, sizeof(int32_t) * (size_t) req->n_user_tokens);
	cai_frame_end(&s->step_out, frame);
}

/* Writes the bytes one token stands for as a text (empty when it cannot be decoded). */
static void
put_token_bytes(server *s, int32_t token)
{
	char	   *text = NULL;
	size_t		len = 0;
	cai_error	err;

	if (cai_detokenize(s->model, &token, 1, &text, &len, &err) != CAI_OK)
		len = 0;
	cai_put_text(&s->step_out, text ? text : "", len);
	free(text);
}

/* Forwards one engine event; returns true when the request finished. */
static bool
handle_event(server *s, const cai_event *ev)
{
	serve_request *req = ev->user_data;
	serve_sample *sm;

	/* a request that failed in a sample earlier this step: its other samples say no more */
	if (!request_live(s, req))
		return false;
	if (req->embed)
		return embed_event(s, req, ev);
	if (ev->sample < 0 || ev->sample >= req->n_samples)
		return false;
	sm = &req->samples[ev->sample];
	if (ev->finish == CAI_FINISH_ERROR)
	{
		(void) cai_engine_cancel(s->engine, req->engine_id);
		send_error(&s->step_out, req->id, CAI_ERR_BACKEND,
				   ev->error ? ev->error : "generation failed");
		request_unlink(s, req);
		return true;
	}
	if (ev->token >= 0 || ev->text_len > 0)
	{
		int32_t		token = (ev->token >= 0 && !is_end_token(s, ev->token)) ? ev->token : -1;

		select_sample(s, req, ev->sample);
		if (token >= 0)
			(void) cai_tokens_push(&sm->generated, token);
		/* the end token is no part of the reply's content: no logprobs for it either */
		if (token >= 0 && ev->logprobs)
		{
			size_t		frame = cai_frame_begin(&s->step_out, CAI_FRAME_MESSAGE, req->id);

			cai_put_u8(&s->step_out, CAI_MSG_LOGPROBS);
			cai_wire_put_logprobs(&s->step_out, ev->logprobs);
			/* the backend has no tokenizer: each listed token's bytes travel along */
			put_token_bytes(s, token);
			for (int i = 0; i < ev->logprobs->n_top; i++)
				put_token_bytes(s, ev->logprobs->top_token[i]);
			cai_frame_end(&s->step_out, frame);
		}
		cai_put_bytes(&sm->text, ev->text, ev->text_len);
		send_message(&s->step_out, req->id, CAI_MSG_TOKEN, &token, sizeof(token), ev->text,
					 ev->text_len);
	}
	if (ev->finish == CAI_FINISH_NONE)
		return false;
	end_sample(s, req, ev);
	if (req->n_ended < req->n_samples)
		return false;
	finish_generation(s, req);
	request_unlink(s, req);
	return true;
}

/*
 * One engine step and its events.  A failed step fails every request the engine holds: their KV
 * may be half-written.
 */
static void
run_step(server *s)
{
	const cai_event *events = NULL;
	int			n_events = 0;
	bool		finished = false;
	cai_error	err;
	cai_status	st;
	double		start = cai_now_seconds();

	cai_wbuf_reset(&s->step_out);
	st = cai_engine_step(s->engine, &events, &n_events, &err);
	if (cai_now_seconds() - start > s->longest_step)
		s->longest_step = cai_now_seconds() - start;
	if (st != CAI_OK)
	{
		send_log(s, "engine step failed: %s", err.message);
		while (s->requests)
		{
			serve_request *req = s->requests;

			request_cancel_engine(s, req);
			send_error(&s->step_out, req->id, st, err.message);
			request_unlink(s, req);
		}
		finished = true;
	}
	else
		for (int i = 0; i < n_events; i++)
			finished |= handle_event(s, &events[i]);

	if (finished || !cai_engine_has_work(s->engine) ||
		cai_now_seconds() - s->last_stats >= STATS_INTERVAL_SECONDS)
		send_stats(s);
	cai_put_bytes(&s->out, s->step_out.data, s->step_out.len);
	if (s->step_out.failed)
		s->out.failed = true;
}

/* ---------------------------------------------------------------------------------------------
 * Input
 * ------------------------------------------------------------------------------------------- */

static void
handle_frame(server *s, const cai_frame_header *h, const char *body)
{
	switch (h->type)
	{
		case CAI_FRAME_REQUEST:
			start_request(s, h->id, body, h->body_len);
			break;

		case CAI_FRAME_CANCEL:
			{
				serve_request *req = request_find(s, h->id);

				if (req)
				{
					request_cancel_engine(s, req);
					request_unlink(s, req);
					s->stats_due = true;
				}
				break;
			}

		case CAI_FRAME_LIMITS:
			{
				cai_reader	r;
				int32_t		max_queue;
				double		max_wait_ms;

				cai_reader_init(&r, body, h->body_len);
				if (!cai_get_i32(&r, &max_queue) || !cai_get_f64(&r, &max_wait_ms))
					s->broken = true;
				else
					cai_engine_set_admission_limits(s->engine, max_queue, max_wait_ms);
				break;
			}

		default:
			s->broken = true;
			break;
	}
}

/*
 * The ids of the CANCEL frames among the whole frames read (malloc'd; NULL when none, or when
 * out of memory: then nothing is skipped).
 */
static uint64_t *
cancels_in_input(const server *s, int *n_out)
{
	uint64_t   *ids = NULL;
	int			n = 0,
				cap = 0;
	size_t		pos = 0;
	cai_frame_header h;

	while (cai_frame_parse(s->in + pos, s->in_len - pos, &h) == 1)
	{
		if (h.type == CAI_FRAME_CANCEL)
		{
			if (n == cap)
			{
				uint64_t   *grown = realloc(ids, sizeof(uint64_t) * (size_t) (cap ? cap * 2 : 16));

				if (!grown)
					break;
				ids = grown;
				cap = cap ? cap * 2 : 16;
			}
			ids[n++] = h.id;
		}
		pos += CAI_FRAME_HEADER_SIZE + h.body_len;
	}
	*n_out = n;
	return ids;
}

/*
 * Reads what the socket has (waiting up to timeout_ms for the first byte) and handles every
 * whole frame.
 */
static void
read_input(server *s, int timeout_ms)
{
	struct pollfd pfd = {.fd = s->fd, .events = POLLIN};
	size_t		pos = 0;
	uint64_t   *cancelled;
	int			n_cancelled = 0;

	if (poll(&pfd, 1, timeout_ms) <= 0)
		return;
	for (;;)
	{
		ssize_t		n;

		if (s->in_cap - s->in_len < READ_CHUNK)
		{
			size_t		cap = s->in_cap ? s->in_cap * 2 : 2 * READ_CHUNK;
			char	   *in;

			if (cap > 2 * (size_t) CAI_FRAME_MAX_BODY + READ_CHUNK)
				break;			/* a whole frame is in; the rest waits for the next call */
			in = realloc(s->in, cap);
			if (!in)
			{
				s->closed = s->broken = true;
				return;
			}
			s->in = in;
			s->in_cap = cap;
		}
		n = recv(s->fd, s->in + s->in_len, s->in_cap - s->in_len, MSG_DONTWAIT);
		if (n > 0)
			s->in_len += (size_t) n;
		else if (n == 0)
		{
			s->closed = true;	/* the worker closed its end: stop */
			break;
		}
		else if (errno == EINTR)
			continue;
		else
		{
			if (errno != EAGAIN && errno != EWOULDBLOCK)
				s->closed = true;
			break;
		}
	}

	cancelled = cancels_in_input(s, &n_cancelled);
	while (!s->broken)
	{
		cai_frame_header h;
		int			r = cai_frame_parse(s->in + pos, s->in_len - pos, &h);
		bool		skip = false;

		if (r == 0)
			break;
		if (r < 0)
		{
			s->broken = true;
			break;
		}

		/*
		 * A request whose cancel is already here (its backend left while it waited in the
		 * socket) is dropped without decoding it: the worker has forgotten it, and decoding
		 * is the largest piece of work a request brings.
		 */
		for (int i = 0; h.type == CAI_FRAME_REQUEST && i < n_cancelled && !skip; i++)
			skip = cancelled[i] == h.id;
		if (!skip)
		{
			double		start = cai_now_seconds();

			handle_frame(s, &h, s->in + pos + CAI_FRAME_HEADER_SIZE);
			if (cai_now_seconds() - start > s->longest_step)
				s->longest_step = cai_now_seconds() - start;
		}
		pos += CAI_FRAME_HEADER_SIZE + h.body_len;

		/*
		 * Decoding a request (tokenizing and templating its history) is a unit of work like a
		 * step: many arriving at once are many units, and the worker hears between them that
		 * the loop turns, rather than silence for all of them together.
		 */
		send_heartbeat_if_due(s);
		flush_output(s);
	}
	free(cancelled);
	memmove(s->in, s->in + pos, s->in_len - pos);
	s->in_len -= pos;
}

/* ---------------------------------------------------------------------------------------------
 * Start and loop
 * ------------------------------------------------------------------------------------------- */

static void
send_failed(server *s, const char *reason, const char *hint)
{
	size_t		frame = cai_frame_begin(&s->out, CAI_FRAME_FAILED, 0);

	cai_put_text(&s->out, reason, strlen(reason));
	cai_put_text(&s->out, hint, strlen(hint));
	cai_frame_end(&s->out, frame);
	flush_output(s);
}

static void
send_ready(server *s, double load_seconds)
{
	cai_wire_model m;
	size_t		frame;

	memset(&m, 0, sizeof(m));
	m.version = CAI_WIRE_VERSION;
	snprintf(m.arch, sizeof(m.arch), "%s", s->info.arch ? s->info.arch : "");
	snprintf(m.name, sizeof(m.name), "%s", s->info.name ? s->info.name : "");
	snprintf(m.chat_template, sizeof(m.chat_template), "%s",
			 s->info.chat_template ? s->info.chat_template : "");
	snprintf(m.device, sizeof(m.device), "%s", cai_engine_device(s->engine));
	snprintf(m.device_reason, sizeof(m.device_reason), "%s", cai_engine_device_reason(s->engine));
	m.n_layers = s->info.n_layers;
	m.d_model = s->info.d_model;
	m.n_heads = s->info.n_heads;
	m.n_kv_heads = s->info.n_kv_heads;
	m.head_dim = s->info.head_dim;
	m.d_ff = s->info.d_ff;
	m.n_vocab = s->info.n_vocab;
	m.trained_context = s->info.context_length;
	m.context_length = s->context_length;
	m.n_params = s->info.n_params;
	m.weight_bytes = s->info.weight_bytes;
	m.kv_bytes_per_token = s->info.kv_bytes_per_token;
	m.kv_window_bytes_per_token = s->info.kv_window_bytes_per_token;
	m.kv_window = s->info.kv_window;
	m.gptq_rounding = s->info.gptq_rounding;
	m.two_digit_activations = s->info.two_digit_activations;
	m.file_weights = s->info.file_weights;
	m.superblock_activations = s->info.superblock_activations;
	m.load_seconds = load_seconds;

	frame = cai_frame_begin(&s->out, CAI_FRAME_READY, 0);
	cai_wire_put_model(&s->out, &m);
	cai_frame_end(&s->out, frame);
	send_stats(s);
	flush_output(s);
}

/*
 * Says in the server log (the engine's stderr) where the weights came from: mapped from the
 * weights cache, or converted (and cached, or why not).  The file is written while the engine
 * answers, so a converting start says so twice: at the start, then when the file is done.
 * Returns whether it is still being written.
 */
static bool
report_weights_cache(const cai_model *model, bool start)
{
	cai_weights_cache_report r;

	cai_model_weights_cache_report(model, &r);
	if (start && r.refused[0])
		fprintf(stderr, "pg_cai engine: weights: cache %s refused, rebuilt: %s\n", r.path,
				r.refused);
	if (r.state == CAI_WEIGHTS_CACHE_MAPPED)
		fprintf(stderr, "pg_cai engine: weights: mapped from cache %s in %.2f s (%.1f MB)\n",
				r.path, r.seconds, (double) r.file_bytes / 1e6);
	else if (r.state == CAI_WEIGHTS_CACHE_PENDING)
		fprintf(stderr, "pg_cai engine: weights: converted in %.2f s, caching to %s while serving\n",
				r.seconds, r.path);
	else if (r.state == CAI_WEIGHTS_CACHE_WRITTEN)
		fprintf(stderr, "pg_cai engine: weights: converted in %.2f s, cached to %s (%.1f MB)\n",
				r.seconds, r.path, (double) r.file_bytes / 1e6);
	else if (r.state != CAI_WEIGHTS_CACHE_OFF)
		fprintf(stderr, "pg_cai engine: weights: converted in %.2f s, not cached to %s: %s\n",
				r.seconds, r.path, r.failure[0] ? r.failure : "not written");
	return r.state == CAI_WEIGHTS_CACHE_PENDING;
}

/* The loop's look at a weights cache file being written: its end goes to the log. */
static void
report_weights_cache_end(server *s)
{
	cai_weights_cache_report r;

	if (!s->weights_cache_pending)
		return;
	cai_model_weights_cache_report(s->model, &r);
	if (r.state != CAI_WEIGHTS_CACHE_PENDING)
		s->weights_cache_pending = report_weights_cache(s->model, false);
}

/* Loads the model and starts the engine; on failure says why in a FAILED frame. */
static bool
start_engine(server *s, const cai_serve_config *config)
{
	char		reason[CAI_ERROR_MESSAGE_SIZE + 256];
	double		start = cai_now_seconds();
	cai_error	err;
	cai_load_watch *watch = cai_load_watch_start(s->fd);
	cai_status	loaded;

	loaded = cai_model_load(config->model_path, &config->model, &s->model, &err);
	if (loaded != CAI_OK)
		s->model = NULL;
	else if ((loaded = cai_engine_create(s->model, &config->engine, &s->engine, &err)) != CAI_OK)
		s->engine = NULL;
	/* the step loop's heartbeats take over, and the socket is this thread's again */
	cai_load_watch_stop(watch);
	if (s->model == NULL)
	{
		snprintf(reason, sizeof(reason), "could not load model \"%s\": %s", config->model_path,
				 err.message);
		send_failed(s, reason,
					"Check pg_cai.model and the server log, then reload the configuration (SELECT pg_reload_conf()). Until then every pg_cai call fails with this error.");
		return false;
	}
	cai_model_get_info(s->model, &s->info);
	if (loaded != CAI_OK)
	{
		snprintf(reason, sizeof(reason), "could not start the engine for model \"%s\": %s",
				 config->model_path, err.message);
		send_failed(s, reason,
					"Check pg_cai.device, pg_cai.context_length and pg_cai.max_batch and the server log, then reload the configuration.");
		return false;
	}
	/* the engine's backend holds its own copy of the int8 matrices now */
	cai_model_release_gemm_sources(s->model);
	s->weights_cache_pending = report_weights_cache(s->model, true);
	s->context_length = cai_engine_context_length(s->engine);
	s->max_running = config->engine.max_running > 0 ? config->engine.max_running : 1;
	send_ready(s, cai_now_seconds() - start);
	return true;
}

int
cai_serve(int fd, const cai_serve_config *config)
{
	server		s;
	int			rc = 0;

	memset(&s, 0, sizeof(s));
	s.fd = fd;
	cai_wbuf_init(&s.out, NULL);
	cai_wbuf_init(&s.step_out, NULL);

	if (!start_engine(&s, config))
		rc = 1;
	while (rc == 0 && !s.closed && !s.broken)
	{
		bool		busy = cai_engine_has_work(s.engine);

		/* between steps only look; when idle, sleep until the worker writes or a heartbeat is due */
		read_input(&s, busy ? 0 : idle_wait_ms(&s));
		if (!s.closed && !s.broken && cai_engine_has_work(s.engine))
			run_step(&s);
		else if (s.stats_due || idle_wait_ms(&s) <= 1)
		{
			/*
			 * Idle, the statistics still move: the disk tier's writer thread goes on after the
			 * last step, and its gauges reach pg_stat_cai with each heartbeat.
			 */
			send_stats(&s);
		}
		s.stats_due = false;
		send_heartbeat_if_due(&s);
		report_weights_cache_end(&s);
		flush_output(&s);
	}
	if (s.broken)
	{
		fprintf(stderr, "pg_cai engine: the worker broke the protocol; exiting\n");
		rc = 1;
	}

	while (s.requests)
		request_unlink(&s, s.requests);
	cai_engine_free(s.engine);
	cai_model_free(s.model);
	cai_wbuf_free(&s.out);
	cai_wbuf_free(&s.step_out);
	free(s.in);
	return rc;
}
