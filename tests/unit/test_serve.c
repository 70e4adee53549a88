/*
 * test_serve.c — the engine process's loop (src/serve/serve.c) over a socket pair, on a
 * synthetic model, speaking the frames of wire.h as the engine worker does: READY first, then
 * tokenize, detokenize, completions and chats streamed as TOKEN messages ending in FINAL, cache
 * reset, cancel, requests it must refuse with a clear error, heartbeats while idle and between
 * the steps of a long generation, and the ends of the loop (the worker closing its end; a frame
 * no worker sends; a model that does not load).
 */
#define _GNU_SOURCE				/* memmem */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "serve.h"
#include "synth_model.h"
#include "test.h"
#include "wire.h"

typedef struct served
{
	int			fd;				/* the worker's end */
	pthread_t	thread;
	int			engine_fd;
	cai_serve_config config;
	char		model_path[128];
	int			rc;				/* cai_serve's result */
	char	   *in;				/* frames read, not yet taken */
	size_t		in_len;
	size_t		in_cap;
	size_t		in_pos;
} served;

static void *
serve_thread(void *arg)
{
	served	   *s = arg;

	s->rc = cai_serve(s->engine_fd, &s->config);
	close(s->engine_fd);
	return NULL;
}

/*
 * Starts cai_serve on a synthetic model (or on model_path when given) in a thread.  The large
 * one takes about a millisecond a token, long enough to cancel a request before its end.
 */
static bool
serve_start_model(served *s, const char *model_path, bool large)
{
	synth_model_config cfg;
	cai_error	err;
	int			sv[2];

	memset(s, 0, sizeof(*s));
	if (model_path)
		snprintf(s->model_path, sizeof(s->model_path), "%s", model_path);
	else
	{
		snprintf(s->model_path, sizeof(s->model_path), "/tmp/cai_test_serve_%d.gguf", (int) getpid());
		synth_model_default_config(&cfg);
		cfg.seed = 11;
		if (large)
		{
			cfg.n_layers = 8;
			cfg.d_model = 256;
			cfg.d_ff = 1024;
			cfg.context_length = 2048;
		}
		if (synth_model_write(s->model_path, &cfg, &err) != CAI_OK)
			return false;
	}
	if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0)
		return false;
	s->fd = sv[0];
	s->engine_fd = sv[1];
	s->config.model_path = s->model_path;
	cai_model_params_default(&s->config.model);
	s->config.model.n_threads = 2;
	cai_engine_params_default(&s->config.engine);
	s->config.engine.device = "cpu";
	s->config.engine.n_threads = 2;
	s->config.engine.max_running = 4;
	s->config.engine.max_step_tokens = 64;
	s->config.engine.context_length = large ? 2048 : 256;
	s->config.engine.max_queue = 8;
	s->config.engine.host_cache_bytes = 1 << 20;
	return pthread_create(&s->thread, NULL, serve_thread, s) == 0;
}

static bool
serve_start(served *s, const char *model_path)
{
	return serve_start_model(s, model_path, false);
}

/* Closes the worker's end and waits for cai_serve; returns its result. */
static int
serve_stop(served *s)
{
	if (s->fd >= 0)
		close(s->fd);
	s->fd = -1;
	pthread_join(s->thread, NULL);
	if (strncmp(s->model_path, "/tmp/cai_test_serve_", 20) == 0)
		unlink(s->model_path);
	free(s->in);
	return s->rc;
}

static bool
send_all(int fd, const void *data, size_t len)
{
	const char *p = data;

	while (len > 0)
	{
		ssize_t		n = write(fd, p, len);

		if (n <= 0)
			return false;
		p += n;
		len -= (size_t) n;
	}
	return true;
}

/* Sends a REQUEST frame: the kind, then the payload. */
static void
send_request(served *s, uint64_t id, cai_request_kind kind, const cai_wbuf *payload)
{
	cai_wbuf	w;
	size_t		frame;

	cai_wbuf_init(&w, NULL);
	frame = cai_frame_begin(&w, CAI_FRAME_REQUEST, id);
	cai_put_u32(&w, kind);
	if (payload)
		cai_put_bytes(&w, payload->data, payload->len);
	cai_frame_end(&w, frame);
	CHECK(send_all(s->fd, w.data, w.len));
	cai_wbuf_free(&w);
}

static void
send_frame(served *s, cai_frame_type type, uint64_t id)
{
	cai_wbuf	w;

	cai_wbuf_init(&w, NULL);
	cai_frame_end(&w, cai_frame_begin(&w, type, id));
	CHECK(send_all(s->fd, w.data, w.len));
	cai_wbuf_free(&w);
}

/*
 * The next frame from the engine (blocking): true with its header and a copy of its body in
 * *body (free it), false at the end of the stream.
 */
static bool
next_frame(served *s, cai_frame_header *h, char **body)
{
	for (;;)
	{
		int			r = cai_frame_parse(s->in + s->in_pos, s->in_len - s->in_pos, h);
		ssize_t		n;

		if (r < 0)
			return false;
		if (r > 0)
		{
			*body = malloc(h->body_len + 1);
			memcpy(*body, s->in + s->in_pos + CAI_FRAME_HEADER_SIZE, h->body_len);
			s->in_pos += CAI_FRAME_HEADER_SIZE + h->body_len;
			return true;
		}
		if (s->in_cap - s->in_len < 4096)
		{
			s->in_cap = s->in_cap ? s->in_cap * 2 : 65536;
			s->in = realloc(s->in, s->in_cap);
		}
		n = read(s->fd, s->in + s->in_len, s->in_cap - s->in_len);
		if (n <= 0)
			return false;
		s->in_len += (size_t) n;
	}
}

/* The next MESSAGE frame (skipping statistics and log lines); its type byte in *type. */
static bool
next_message(served *s, uint64_t *id, char **body, uint32_t *len)
{
	cai_frame_header h;

	while (next_frame(s, &h, body))
	{
		if (h.type == CAI_FRAME_MESSAGE)
		{
			*id = h.id;
			*len = h.body_len;
			return h.body_len >= 1;
		}
		free(*body);
	}
	return false;
}

/* The generation block of a request with these options (greedy unless temperature > 0). */
static void
put_generation(cai_wbuf *w, int max_tokens, float temperature, bool ignore_eos)
{
	cai_wire_generation g;

	cai_wire_generation_init(&g);
	g.temperature = temperature;
	g.top_p = 1.0f;
	g.max_tokens = max_tokens;
	g.truncate = true;
	g.ignore_eos = ignore_eos;
	g.use_cache = true;
	cai_wire_put_generation(w, &g);
}

typedef struct generation
{
	int			n_tokens;
	char		text[4096];
	size_t		text_len;
	cai_wire_final final;
	bool		have_final;
	int32_t		error_status;	/* 0 unless an ERROR came */
	char		error[512];
	/* a request of several samples: tokens and ends per SAMPLE message */
	int			sample;
	int			sample_tokens[CAI_N_SAMPLES_MAX];
	int			n_sample_ends;
	cai_wire_final sample_final[CAI_N_SAMPLES_MAX];
} generation;

/* Reads the messages of request id until its last one. */
static void
read_generation(served *s, uint64_t id, generation *g)
{
	char	   *body;
	uint64_t	got;
	uint32_t	len;

	memset(g, 0, sizeof(*g));
	while (next_message(s, &got, &body, &len))
	{
		cai_reader	r;
		char		type = body[0];

		CHECK_EQ_INT(got, id);
		cai_reader_init(&r, body + 1, len - 1);
		if (type == CAI_MSG_TOKEN)
		{
			int32_t		token;

			CHECK(cai_get_i32(&r, &token));
			if (token >= 0)
			{
				g->n_tokens++;
				g->sample_tokens[g->sample]++;
			}
			if (g->text_len + cai_reader_remaining(&r) < sizeof(g->text))
			{
				memcpy(g->text + g->text_len, body + 5, cai_reader_remaining(&r));
				g->text_len += cai_reader_remaining(&r);
			}
			free(body);
			continue;
		}
		if (type == CAI_MSG_SAMPLE || type == CAI_MSG_SAMPLE_END)
		{
			int32_t		sample = 0;

			if (type == CAI_MSG_SAMPLE)
				CHECK(cai_get_i32(&r, &sample) && sample >= 0 && sample < CAI_N_SAMPLES_MAX &&
					  cai_reader_remaining(&r) == 0);
			if (type == CAI_MSG_SAMPLE)
				g->sample = sample;
			else
			{
				CHECK(cai_wire_get_final(&r, &g->sample_final[g->sample]));
				g->n_sample_ends++;
			}
			free(body);
			continue;
		}
		if (type == CAI_MSG_FINAL)
		{
			g->have_final = cai_wire_get_final(&r, &g->final);
			CHECK(g->have_final);
			CHECK_EQ_INT(cai_reader_remaining(&r), sizeof(int32_t) * (size_t) g->final.n_user_tokens);
		}
		else if (type == CAI_MSG_ERROR)
		{
			CHECK(cai_get_i32(&r, &g->error_status));
			snprintf(g->error, sizeof(g->error), "%.*s", (int) cai_reader_remaining(&r),
					 body + 5);
		}
		else
			CHECK_MSG(false, "unexpected message type %c", type);
		free(body);
		return;
	}
	CHECK_MSG(false, "the stream ended before request %llu finished", (unsigned long long) id);
}

/*
 * READY must be the engine's first frame but for the load's heartbeats (no step yet: a longest
 * step of 0), which a load longer than the heartbeat interval sends.
 */
static void
expect_ready(served *s)
{
	cai_frame_header h;
	char	   *body = NULL;
	cai_reader	r;
	cai_wire_model m;
	double		longest = -1.0;

	memset(&h, 0, sizeof(h));
	while (next_frame(s, &h, &body) && h.type == CAI_FRAME_HEARTBEAT)
	{
		cai_reader_init(&r, body, h.body_len);
		CHECK(cai_get_f64(&r, &longest) && longest == 0.0);
		free(body);
		body = NULL;
	}
	CHECK_EQ_INT(h.type, CAI_FRAME_READY);
	if (h.type != CAI_FRAME_READY)
	{
		free(body);
		return;
	}
	cai_reader_init(&r, body, h.body_len);
	CHECK(cai_wire_get_model(&r, &m));
	CHECK_EQ_INT(m.version, CAI_WIRE_VERSION);
	CHECK(strcmp(m.name, "synthetic") == 0);
	CHECK(m.context_length == 256 || m.context_length == 2048);
	CHECK(strncmp(m.device, "cpu", 3) == 0);
	free(body);
}

TEST(serve_answers_requests_in_the_wire_format)
{
	served		s;
	cai_wbuf	p;
	char	   *body;
	uint64_t	id = 0;
	uint32_t	len;
	generation	g;

	CHECK(serve_start(&s, NULL));
	expect_ready(&s);

	/* tokenize, then detokenize the ids back */
	cai_wbuf_init(&p, NULL);
	cai_put_text(&p, "hello world", 11);
	send_request(&s, 1, CAI_REQUEST_TOKENIZE, &p);
	CHECK(next_message(&s, &id, &body, &len));
	CHECK_EQ_INT(id, 1);
	CHECK_EQ_INT(body[0], CAI_MSG_IDS);
	{
		int32_t		count;
		cai_reader	r;

		cai_reader_init(&r, body + 1, len - 1);
		CHECK(cai_get_i32(&r, &count));
		CHECK(count > 0 && (size_t) count * 4 == cai_reader_remaining(&r));
		cai_wbuf_reset(&p);
		cai_put_bytes(&p, body + 1, len - 1);
		free(body);
		send_request(&s, 2, CAI_REQUEST_DETOKENIZE, &p);
		CHECK(next_message(&s, &id, &body, &len));
		CHECK_EQ_INT(id, 2);
		CHECK(body[0] == CAI_MSG_TEXT && len == 12 && memcmp(body + 1, "hello world", 11) == 0);
		free(body);
	}

	/* a completion streams its tokens, then FINAL */
	cai_wbuf_reset(&p);
	put_generation(&p, 6, 0.0f, true);
	cai_put_text(&p, "one two three", 13);
	send_request(&s, 3, CAI_REQUEST_COMPLETE, &p);
	read_generation(&s, 3, &g);
	CHECK(g.have_final);
	CHECK_EQ_INT(g.n_tokens, 6);
	CHECK_EQ_INT(g.final.completion_tokens, 6);
	CHECK_EQ_INT(g.final.finish, CAI_FINISH_LENGTH);
	CHECK(g.final.prompt_tokens > 0);

	/* a chat: the last turn's content ids come back with FINAL */
	cai_wbuf_reset(&p);
	put_generation(&p, 4, 0.0f, true);
	cai_put_i32(&p, 2);
	cai_wire_put_turn(&p, CAI_ROLE_SYSTEM, "Be brief.", 9, NULL, -1);
	cai_wire_put_turn(&p, CAI_ROLE_USER, "hello", 5, NULL, -1);
	send_request(&s, 4, CAI_REQUEST_CHAT, &p);
	read_generation(&s, 4, &g);
	CHECK(g.have_final);
	CHECK(g.final.n_user_tokens > 0);
	CHECK_EQ_INT(g.final.completion_tokens, 4);

	/* three samples of one completion: each streams under its SAMPLE and ends on its own, and
	 * FINAL counts the prompt once and every sample's tokens */
	cai_wbuf_reset(&p);
	{
		cai_wire_generation gen;

		cai_wire_generation_init(&gen);
		gen.temperature = 1.0f;
		gen.top_p = 1.0f;
		gen.max_tokens = 5;
		gen.ignore_eos = true;
		gen.n_samples = 3;
		cai_wire_put_generation(&p, &gen);
	}
	cai_put_text(&p, "one two three", 13);
	send_request(&s, 6, CAI_REQUEST_COMPLETE, &p);
	read_generation(&s, 6, &g);
	CHECK(g.have_final);
	CHECK_EQ_INT(g.n_sample_ends, 3);
	for (int i = 0; i < 3; i++)
	{
		CHECK_EQ_INT(g.sample_tokens[i], 5);
		CHECK_EQ_INT(g.sample_final[i].completion_tokens, 5);
		CHECK_EQ_INT(g.sample_final[i].finish, CAI_FINISH_LENGTH);
	}
	CHECK_EQ_INT(g.final.completion_tokens, 15);
	CHECK_EQ_INT(g.final.prompt_tokens, g.sample_final[0].prompt_tokens);

	/* cache reset answers OK */
	send_request(&s, 5, CAI_REQUEST_CACHE_RESET, NULL);
	CHECK(next_message(&s, &id, &body, &len));
	CHECK(id == 5 && body[0] == CAI_MSG_OK && len == 1);
	free(body);

	cai_wbuf_free(&p);
	CHECK_EQ_INT(serve_stop(&s), 0);
}

TEST(serve_refuses_bad_requests_clearly)
{
	served		s;
	cai_wbuf	p;
	generation	g;

	CHECK(serve_start(&s, NULL));
	expect_ready(&s);
	cai_wbuf_init(&p, NULL);

	/* an unknown kind, a truncated chat, trailing bytes: malformed, an internal error */
	send_request(&s, 1, (cai_request_kind) 99, NULL);
	read_generation(&s, 1, &g);
	CHECK_EQ_INT(g.error_status, CAI_ERR_INTERNAL);
	CHECK(strstr(g.error, "unknown request kind") != NULL);

	put_generation(&p, 4, 0.0f, false);
	cai_put_i32(&p, 3);			/* three turns announced, none sent */
	send_request(&s, 2, CAI_REQUEST_CHAT, &p);
	read_generation(&s, 2, &g);
	CHECK_EQ_INT(g.error_status, CAI_ERR_INTERNAL);
	CHECK(strstr(g.error, "malformed chat request") != NULL);

	cai_wbuf_reset(&p);
	cai_put_text(&p, "hi", 2);
	cai_put_u8(&p, 7);
	send_request(&s, 3, CAI_REQUEST_TOKENIZE, &p);
	read_generation(&s, 3, &g);
	CHECK_EQ_INT(g.error_status, CAI_ERR_INTERNAL);

	/* values out of range: the option is named */
	cai_wbuf_reset(&p);
	put_generation(&p, 4, -1.0f, false);
	cai_put_text(&p, "hi", 2);
	send_request(&s, 4, CAI_REQUEST_COMPLETE, &p);
	read_generation(&s, 4, &g);
	CHECK_EQ_INT(g.error_status, CAI_ERR_INVALID_ARGUMENT);
	CHECK(strstr(g.error, "temperature") != NULL);

	cai_wbuf_reset(&p);
	{
		cai_wire_generation gen;

		cai_wire_generation_init(&gen);
		gen.top_p = 1.0f;
		gen.max_tokens = 4;
		gen.n_samples = 17;
		cai_wire_put_generation(&p, &gen);
	}
	cai_put_text(&p, "hi", 2);
	send_request(&s, 40, CAI_REQUEST_COMPLETE, &p);
	read_generation(&s, 40, &g);
	CHECK_EQ_INT(g.error_status, CAI_ERR_INVALID_ARGUMENT);
	CHECK(strstr(g.error, "n must be between 1 and 16 (got 17)") != NULL);

	/* cai.h's limits, the same the SQL options take: temperature at most 2 */
	cai_wbuf_reset(&p);
	put_generation(&p, 4, 2.5f, false);
	cai_put_text(&p, "hi", 2);
	send_request(&s, 14, CAI_REQUEST_COMPLETE, &p);
	read_generation(&s, 14, &g);
	CHECK_EQ_INT(g.error_status, CAI_ERR_INVALID_ARGUMENT);
	CHECK(strstr(g.error, "temperature must be between 0 and 2") != NULL);

	cai_wbuf_reset(&p);
	{
		int32_t		ids[2] = {1, 1 << 30};

		cai_put_i32(&p, 2);
		cai_put_bytes(&p, ids, sizeof(ids));
	}
	send_request(&s, 5, CAI_REQUEST_DETOKENIZE, &p);
	read_generation(&s, 5, &g);
	CHECK_EQ_INT(g.error_status, CAI_ERR_INVALID_ARGUMENT);
	CHECK(strstr(g.error, "out of range") != NULL);

	/* a stop string with a NUL byte cannot be meant */
	cai_wbuf_reset(&p);
	{
		cai_wire_generation gen;
		char	   *x;

		cai_wire_generation_init(&gen);
		gen.top_p = 1.0f;
		gen.max_tokens = 4;
		gen.n_stop = 1;
		gen.stop[0] = "a\x7f\x7f";
		cai_wire_put_generation(&p, &gen);
		x = memmem(p.data, p.len, "a\x7f\x7f", 3);	/* the stop string becomes "a\0\x7f" */
		CHECK(x != NULL);
		if (x)
			x[1] = '\0';
		cai_put_text(&p, "hi", 2);
	}
	send_request(&s, 6, CAI_REQUEST_COMPLETE, &p);
	read_generation(&s, 6, &g);
	CHECK_EQ_INT(g.error_status, CAI_ERR_INVALID_ARGUMENT);

	/* after all of that the engine still serves */
	cai_wbuf_reset(&p);
	put_generation(&p, 3, 0.0f, true);
	cai_put_text(&p, "hi", 2);
	send_request(&s, 7, CAI_REQUEST_COMPLETE, &p);
	read_generation(&s, 7, &g);
	CHECK(g.have_final && g.final.completion_tokens == 3);

	cai_wbuf_free(&p);
	CHECK_EQ_INT(serve_stop(&s), 0);
}

TEST(serve_cancel_drops_the_request)
{
	served		s;
	cai_wbuf	p;
	char	   *body;
	uint64_t	id = 0;
	uint32_t	len;
	generation	g;
	int			tokens = 0;

	CHECK(serve_start_model(&s, NULL, true));
	expect_ready(&s);
	cai_wbuf_init(&p, NULL);
	put_generation(&p, 2000, 0.0f, true);
	cai_put_text(&p, "count", 5);
	send_request(&s, 1, CAI_REQUEST_COMPLETE, &p);
	CHECK(next_message(&s, &id, &body, &len));
	CHECK(id == 1 && body[0] == CAI_MSG_TOKEN);
	free(body);
	send_frame(&s, CAI_FRAME_CANCEL, 1);

	/*
	 * Frames are handled in order: once request 2 (sent after the cancel) is answered, nothing
	 * more comes for request 1, and it never finished.
	 */
	cai_wbuf_reset(&p);
	cai_put_text(&p, "x", 1);
	send_request(&s, 2, CAI_REQUEST_TOKENIZE, &p);
	for (;;)
	{
		CHECK(next_message(&s, &id, &body, &len));
		if (id == 2)
		{
			CHECK_EQ_INT(body[0], CAI_MSG_IDS);
			free(body);
			break;
		}
		CHECK(id == 1 && body[0] == CAI_MSG_TOKEN);
		free(body);
		if (++tokens >= 2000)
			break;
	}
	CHECK_MSG(tokens < 1000, "%d tokens came after the cancel", tokens);

	/* cancelling an unknown or finished request is harmless; request 3 sees only its own */
	send_frame(&s, CAI_FRAME_CANCEL, 42);
	cai_wbuf_reset(&p);
	put_generation(&p, 2, 0.0f, true);
	cai_put_text(&p, "hi", 2);
	send_request(&s, 3, CAI_REQUEST_COMPLETE, &p);
	read_generation(&s, 3, &g);
	CHECK(g.have_final);

	cai_wbuf_free(&p);
	CHECK_EQ_INT(serve_stop(&s), 0);
}

/*
 * A request whose cancel is read with it (its backend left while it waited in the socket) is
 * dropped undecoded: no answer comes for it, while the next request is answered.  Both frames
 * go out in one write, so that the engine reads them together.
 */
TEST(serve_drops_a_request_cancelled_before_it_was_decoded)
{
	served		s;
	cai_wbuf	w;
	cai_wbuf	p;
	size_t		frame;
	char	   *body;
	uint64_t	id = 0;
	uint32_t	len;

	CHECK(serve_start(&s, NULL));
	expect_ready(&s);
	cai_wbuf_init(&w, NULL);
	cai_wbuf_init(&p, NULL);
	frame = cai_frame_begin(&w, CAI_FRAME_REQUEST, 5);
	cai_put_u32(&w, CAI_REQUEST_TOKENIZE);
	cai_put_text(&w, "dropped", 7);
	cai_frame_end(&w, frame);
	cai_frame_end(&w, cai_frame_begin(&w, CAI_FRAME_CANCEL, 5));
	CHECK(send_all(s.fd, w.data, w.len));

	cai_put_text(&p, "answered", 8);
	send_request(&s, 6, CAI_REQUEST_TOKENIZE, &p);
	CHECK(next_message(&s, &id, &body, &len));
	CHECK_MSG(id == 6, "the first answer is for request %llu, not 6", (unsigned long long) id);
	CHECK_EQ_INT(body[0], CAI_MSG_IDS);
	free(body);

	cai_wbuf_free(&p);
	cai_wbuf_free(&w);
	CHECK_EQ_INT(serve_stop(&s), 0);
}

/*
 * Heartbeats come from the step loop: while idle, and between the steps of a generation that
 * streams for longer than the heartbeat interval (the large model takes about a millisecond a
 * token, so 2000 tokens take seconds).  Reads give up after 10 s instead of hanging.
 */
TEST(serve_sends_heartbeats_while_idle_and_busy)
{
	served		s;
	cai_wbuf	p;
	cai_frame_header h;
	char	   *body;
	struct timeval limit = {.tv_sec = 10};
	int			idle_beats = 0;
	int			busy_beats = 0;
	bool		final = false;

	CHECK(serve_start_model(&s, NULL, true));
	CHECK(setsockopt(s.fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof(limit)) == 0);
	expect_ready(&s);
	while (idle_beats < 3 && next_frame(&s, &h, &body))
	{
		if (h.type == CAI_FRAME_HEARTBEAT)
		{
			cai_reader	r;
			double		longest;

			cai_reader_init(&r, body, h.body_len);
			CHECK(cai_get_f64(&r, &longest) && longest >= 0.0);
			idle_beats++;
		}
		free(body);
	}
	CHECK_EQ_INT(idle_beats, 3);

	cai_wbuf_init(&p, NULL);
	put_generation(&p, 2000, 0.0f, true);
	cai_put_text(&p, "count", 5);
	send_request(&s, 1, CAI_REQUEST_COMPLETE, &p);
	while (!final && next_frame(&s, &h, &body))
	{
		if (h.type == CAI_FRAME_HEARTBEAT)
		{
			cai_reader	r;
			double		longest;

			cai_reader_init(&r, body, h.body_len);
			CHECK(cai_get_f64(&r, &longest) && longest > 0.0);
			busy_beats++;
		}
		else if (h.type == CAI_FRAME_MESSAGE)
			final = body[0] != CAI_MSG_TOKEN;
		free(body);
	}
	CHECK(final);
	CHECK_MSG(busy_beats > 0, "no heartbeat during a generation of 2000 tokens");

	cai_wbuf_free(&p);
	CHECK_EQ_INT(serve_stop(&s), 0);
}

TEST(serve_ends_on_protocol_violation_and_load_failure)
{
	served		s;
	cai_frame_header h;
	char	   *body;

	/* a frame type no worker sends */
	CHECK(serve_start(&s, NULL));
	expect_ready(&s);
	send_frame(&s, (cai_frame_type) 'Z', 1);
	CHECK_EQ_INT(serve_stop(&s), 1);

	/* a frame longer than any request may be */
	CHECK(serve_start(&s, NULL));
	expect_ready(&s);
	{
		char		header[CAI_FRAME_HEADER_SIZE] = {0};
		uint32_t	huge = CAI_FRAME_MAX_BODY + 1;

		memcpy(header, &huge, sizeof(huge));
		header[4] = CAI_FRAME_REQUEST;
		CHECK(send_all(s.fd, header, sizeof(header)));
	}
	CHECK_EQ_INT(serve_stop(&s), 1);

	/* a model that does not load: FAILED says why */
	CHECK(serve_start(&s, "/nonexistent/model.gguf"));
	CHECK(next_frame(&s, &h, &body));
	CHECK_EQ_INT(h.type, CAI_FRAME_FAILED);
	if (h.type == CAI_FRAME_FAILED)
	{
		cai_reader	r;
		const char *reason;
		uint32_t	len;

		cai_reader_init(&r, body, h.body_len);
		CHECK(cai_get_text(&r, &reason, &len));
		CHECK(len > 0 && memmem(reason, len, "/nonexistent/model.gguf", 23) != NULL);
	}
	free(body);
	CHECK_EQ_INT(serve_stop(&s), 1);
}
