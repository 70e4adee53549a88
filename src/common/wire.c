/*
 * wire.c — writers and bounds-checked readers of the formats in wire.h.
 */
#include <stdlib.h>
#include <string.h>

#include "wire.h"

/* ---------------------------------------------------------------------------------------------
 * Writing
 * ------------------------------------------------------------------------------------------- */

void
cai_wbuf_init(cai_wbuf *w, cai_wire_realloc_fn grow)
{
	memset(w, 0, sizeof(*w));
	w->grow = grow;
}

void
cai_wbuf_free(cai_wbuf *w)
{
	if (w->grow == NULL)
		free(w->data);
	w->data = NULL;
	w->len = w->cap = 0;
}

void
cai_wbuf_reset(cai_wbuf *w)
{
	w->len = 0;
	w->failed = false;
}

static bool
wbuf_reserve(cai_wbuf *w, size_t extra)
{
	size_t		need;
	size_t		cap;
	char	   *data;

	if (w->failed)
		return false;
	if (extra > SIZE_MAX / 2 - w->len)
	{
		w->failed = true;
		return false;
	}
	need = w->len + extra;
	if (need <= w->cap)
		return true;
	cap = w->cap ? w->cap : 256;
	while (cap < need)
		cap *= 2;
	data = w->grow ? w->grow(w->data, cap) : realloc(w->data, cap);
	if (!data)
	{
		w->failed = true;
		return false;
	}
	w->data = data;
	w->cap = cap;
	return true;
}

void
cai_put_bytes(cai_wbuf *w, const void *data, size_t len)
{
	if (len == 0 || !wbuf_reserve(w, len))
		return;
	memcpy(w->data + w->len, data, len);
	w->len += len;
}

/* Fixed-size values, written and read as their bytes in the host's order. */
#define WIRE_SCALAR(suffix, type) \
	void \
	cai_put_##suffix(cai_wbuf *w, type v) \
	{ \
		cai_put_bytes(w, &v, sizeof(v)); \
	} \
	bool \
	cai_get_##suffix(cai_reader *r, type *v) \
	{ \
		return cai_get_bytes(r, v, sizeof(*v)); \
	}

WIRE_SCALAR(u8, uint8_t)
WIRE_SCALAR(i32, int32_t)
WIRE_SCALAR(u32, uint32_t)
WIRE_SCALAR(u64, uint64_t)
WIRE_SCALAR(f32, float)
WIRE_SCALAR(f64, double)

void
cai_put_text(cai_wbuf *w, const char *text, size_t len)
{
	if (len > UINT32_MAX)
	{
		w->failed = true;
		return;
	}
	cai_put_u32(w, (uint32_t) len);
	cai_put_bytes(w, text, len);
}

/* ---------------------------------------------------------------------------------------------
 * Reading
 * ------------------------------------------------------------------------------------------- */

void
cai_reader_init(cai_reader *r, const void *data, size_t len)
{
	r->data = (const char *) data;
	r->len = len;
	r->pos = 0;
}

size_t
cai_reader_remaining(const cai_reader *r)
{
	return r->len - r->pos;
}

bool
cai_get_bytes(cai_reader *r, void *out, size_t len)
{
	if (len > r->len - r->pos)
		return false;
	if (len > 0)
		memcpy(out, r->data + r->pos, len);
	r->pos += len;
	return true;
}

bool
cai_get_text(cai_reader *r, const char **text, uint32_t *len)
{
	uint32_t	n;
	size_t		start = r->pos;

	if (!cai_get_u32(r, &n))
		return false;
	if (n > r->len - r->pos)
	{
		r->pos = start;
		return false;
	}
	*text = r->data + r->pos;
	*len = n;
	r->pos += n;
	return true;
}

bool
cai_get_i32_array(cai_reader *r, int32_t count, int32_t *out)
{
	if (count < 0 || (size_t) count > (r->len - r->pos) / sizeof(int32_t))
		return false;
	return cai_get_bytes(r, out, (size_t) count * sizeof(int32_t));
}

/* A flag byte: exactly 0 or 1 (anything else is a malformed payload, never a "true"). */
static bool
get_flag(cai_reader *r, bool *flag)
{
	uint8_t		b;

	if (!cai_get_u8(r, &b) || b > 1)
		return false;
	*flag = b == 1;
	return true;
}

/* ---------------------------------------------------------------------------------------------
 * The generation block and turns
 * ------------------------------------------------------------------------------------------- */

void
cai_wire_generation_init(cai_wire_generation *g)
{
	memset(g, 0, sizeof(*g));
	g->repetition_penalty = 1.0f;
	g->n_samples = 1;
}

void
cai_wire_put_generation(cai_wbuf *w, const cai_wire_generation *g)
{
	cai_put_f32(w, g->temperature);
	cai_put_f32(w, g->top_p);
	cai_put_i32(w, g->top_k);
	cai_put_u64(w, g->seed);
	cai_put_i32(w, g->max_tokens);
	cai_put_u8(w, g->truncate ? 1 : 0);
	cai_put_u8(w, g->ignore_eos ? 1 : 0);
	cai_put_u8(w, g->use_cache ? 1 : 0);
	cai_put_u64(w, g->cache_salt);
	cai_put_u64(w, g->cache_owner);
	cai_put_i32(w, g->n_stop);
	for (int i = 0; i < g->n_stop && i < CAI_MAX_STOP_STRINGS; i++)
		cai_put_text(w, g->stop[i], strlen(g->stop[i]));
	cai_put_u8(w, g->response_format);
	if (g->response_format == CAI_RESPONSE_JSON_SCHEMA && g->schema)
		cai_put_text(w, g->schema, strlen(g->schema));
	else
		cai_put_text(w, "", 0);
	cai_put_u8(w, g->json_whitespace);
	cai_put_f32(w, g->presence_penalty);
	cai_put_f32(w, g->frequency_penalty);
	cai_put_f32(w, g->repetition_penalty);
	cai_put_f32(w, g->min_p);
	cai_put_i32(w, g->n_logit_bias);
	for (int i = 0; i < g->n_logit_bias; i++)
	{
		cai_put_i32(w, g->logit_bias[i].token);
		cai_put_f32(w, g->logit_bias[i].bias);
	}
	cai_put_u8(w, g->logprobs ? 1 : 0);
	cai_put_i32(w, g->top_logprobs);
	cai_put_i32(w, g->n_samples);
}

/* Copies entry i of a read generation block's logit_bias out of the payload. */
cai_logit_bias
cai_wire_logit_bias_at(const cai_wire_generation *g, int i)
{
	cai_logit_bias b;

	memcpy(&b.token, g->logit_bias_bytes + (size_t) i * 8, sizeof(int32_t));
	memcpy(&b.bias, g->logit_bias_bytes + (size_t) i * 8 + 4, sizeof(float));
	return b;
}

bool
cai_wire_get_generation(cai_reader *r, cai_wire_generation *g)
{
	memset(g, 0, sizeof(*g));
	if (!cai_get_f32(r, &g->temperature) || !cai_get_f32(r, &g->top_p) ||
		!cai_get_i32(r, &g->top_k) || !cai_get_u64(r, &g->seed) ||
		!cai_get_i32(r, &g->max_tokens) || !get_flag(r, &g->truncate) ||
		!get_flag(r, &g->ignore_eos) || !get_flag(r, &g->use_cache) ||
		!cai_get_u64(r, &g->cache_salt) || !cai_get_u64(r, &g->cache_owner) ||
		!cai_get_i32(r, &g->n_stop))
		return false;
	if (g->n_stop < 0 || g->n_stop > CAI_MAX_STOP_STRINGS)
		return false;
	for (int i = 0; i < g->n_stop; i++)
		if (!cai_get_text(r, &g->stop[i], &g->stop_len[i]))
			return false;
	if (!cai_get_u8(r, &g->response_format) || g->response_format > CAI_RESPONSE_JSON_SCHEMA ||
		!cai_get_text(r, &g->schema, &g->schema_len) ||
		!cai_get_u8(r, &g->json_whitespace) || g->json_whitespace > CAI_JSON_WS_COMPACT)
		return false;
	if (!cai_get_f32(r, &g->presence_penalty) || !cai_get_f32(r, &g->frequency_penalty) ||
		!cai_get_f32(r, &g->repetition_penalty) || !cai_get_f32(r, &g->min_p) ||
		!cai_get_i32(r, &g->n_logit_bias) || g->n_logit_bias < 0 ||
		g->n_logit_bias > CAI_MAX_LOGIT_BIAS ||
		cai_reader_remaining(r) < (size_t) g->n_logit_bias * 8)
		return false;
	/* the entries stay in the payload; cai_wire_logit_bias_at reads them */
	g->logit_bias_bytes = r->data + r->pos;
	r->pos += (size_t) g->n_logit_bias * 8;
	if (!get_flag(r, &g->logprobs) || !cai_get_i32(r, &g->top_logprobs) ||
		!cai_get_i32(r, &g->n_samples))
		return false;
	return true;
}

void
cai_wire_put_turn(cai_wbuf *w, int role, const char *content, size_t content_len,
				  const int32_t *tokens, int n_tokens)
{
	cai_put_i32(w, role);
	cai_put_text(w, content, content_len);
	if (tokens == NULL || n_tokens < 0)
		cai_put_i32(w, -1);
	else
	{
		cai_put_i32(w, n_tokens);
		cai_put_bytes(w, tokens, sizeof(int32_t) * (size_t) n_tokens);
	}
}

/* ---------------------------------------------------------------------------------------------
 * Response messages
 * ------------------------------------------------------------------------------------------- */

void
cai_wire_put_final(cai_wbuf *w, const cai_wire_final *f)
{
	cai_put_i32(w, f->finish);
	cai_put_i32(w, f->prompt_tokens);
	cai_put_i32(w, f->cached_tokens);
	cai_put_i32(w, f->completion_tokens);
	cai_put_f64(w, f->queue_ms);
	cai_put_f64(w, f->ttft_ms);
	cai_put_f64(w, f->total_ms);
	cai_put_i32(w, f->first_message);
	cai_put_u8(w, f->tokens_exact ? 1 : 0);
	cai_put_i32(w, f->n_user_tokens);
}

bool
cai_wire_get_final(cai_reader *r, cai_wire_final *f)
{
	memset(f, 0, sizeof(*f));
	return cai_get_i32(r, &f->finish) && cai_get_i32(r, &f->prompt_tokens) &&
		cai_get_i32(r, &f->cached_tokens) && cai_get_i32(r, &f->completion_tokens) &&
		cai_get_f64(r, &f->queue_ms) && cai_get_f64(r, &f->ttft_ms) &&
		cai_get_f64(r, &f->total_ms) && cai_get_i32(r, &f->first_message) &&
		get_flag(r, &f->tokens_exact) && cai_get_i32(r, &f->n_user_tokens) &&
		f->n_user_tokens >= 0;
}

void
cai_wire_put_error(cai_wbuf *w, int32_t status, const char *message)
{
	cai_put_i32(w, status);
	cai_put_bytes(w, message, strlen(message));
}

/* ---------------------------------------------------------------------------------------------
 * Frames
 * ------------------------------------------------------------------------------------------- */

size_t
cai_frame_begin(cai_wbuf *w, cai_frame_type type, uint64_t id)
{
	size_t		start = w->len;

	cai_put_u32(w, 0);			/* the body's length, filled in by cai_frame_end */
	cai_put_u8(w, (uint8_t) type);
	cai_put_u8(w, 0);
	cai_put_u8(w, 0);
	cai_put_u8(w, 0);
	cai_put_u64(w, id);
	return start;
}

void
cai_frame_end(cai_wbuf *w, size_t start)
{
	uint32_t	body_len;

	if (w->failed || w->len - start - CAI_FRAME_HEADER_SIZE > CAI_FRAME_MAX_BODY)
	{
		w->failed = true;
		return;
	}
	body_len = (uint32_t) (w->len - start - CAI_FRAME_HEADER_SIZE);
	memcpy(w->data + start, &body_len, sizeof(body_len));
}

int
cai_frame_parse(const char *data, size_t len, cai_frame_header *header)
{
	if (len < CAI_FRAME_HEADER_SIZE)
		return 0;
	memcpy(&header->body_len, data, sizeof(header->body_len));
	header->type = (uint8_t) data[4];
	memcpy(&header->id, data + 8, sizeof(header->id));
	if (header->body_len > CAI_FRAME_MAX_BODY)
		return -1;
	if (len - CAI_FRAME_HEADER_SIZE < header->body_len)
		return 0;
	return 1;
}

/* A fixed-size string field: written as text, read back cut to the field and terminated. */
static bool
get_string_field(cai_reader *r, char *field, size_t size)
{
	const char *text;
	uint32_t	len;

	if (!cai_get_text(r, &text, &len))
		return false;
	if (len >= size)
		len = (uint32_t) (size - 1);
	memcpy(field, text, len);
	field[len] = '\0';
	return true;
}

static void
put_string_field(cai_wbuf *w, const char *field, size_t size)
{
	cai_put_text(w, field, strnlen(field, size));
}

void
cai_wire_put_model(cai_wbuf *w, const cai_wire_model *m)
{
	cai_put_u32(w, m->version);
	put_string_field(w, m->arch, sizeof(m->arch));
	put_string_field(w, m->name, sizeof(m->name));
	put_string_field(w, m->chat_template, sizeof(m->chat_template));
	put_string_field(w, m->device, sizeof(m->device));
	put_string_field(w, m->device_reason, sizeof(m->device_reason));
	cai_put_i32(w, m->n_layers);
	cai_put_i32(w, m->d_model);
	cai_put_i32(w, m->n_heads);
	cai_put_i32(w, m->n_kv_heads);
	cai_put_i32(w, m->head_dim);
	cai_put_i32(w, m->d_ff);
	cai_put_i32(w, m->n_vocab);
	cai_put_i32(w, m->trained_context);
	cai_put_i32(w, m->context_length);
	cai_put_u64(w, (uint64_t) m->n_params);
	cai_put_u64(w, m->weight_bytes);
	cai_put_u64(w, m->kv_bytes_per_token);
	cai_put_u64(w, m->kv_window_bytes_per_token);
	cai_put_i32(w, m->kv_window);
	cai_put_u32(w, m->gptq_rounding);
	cai_put_u32(w, m->two_digit_activations);
	cai_put_u32(w, m->file_weights);
	cai_put_u32(w, m->superblock_activations);
	cai_put_f64(w, m->load_seconds);
}

bool
cai_wire_get_model(cai_reader *r, cai_wire_model *m)
{
	uint64_t	n_params;

	memset(m, 0, sizeof(*m));
	if (!cai_get_u32(r, &m->version))
		return false;
	/* a binary of another version may lay out the rest differently: read no further */
	if (m->version != CAI_WIRE_VERSION)
		return true;
	if (!get_string_field(r, m->arch, sizeof(m->arch)) ||
		!get_string_field(r, m->name, sizeof(m->name)) ||
		!get_string_field(r, m->chat_template, sizeof(m->chat_template)) ||
		!get_string_field(r, m->device, sizeof(m->device)) ||
		!get_string_field(r, m->device_reason, sizeof(m->device_reason)) ||
		!cai_get_i32(r, &m->n_layers) || !cai_get_i32(r, &m->d_model) ||
		!cai_get_i32(r, &m->n_heads) || !cai_get_i32(r, &m->n_kv_heads) ||
		!cai_get_i32(r, &m->head_dim) || !cai_get_i32(r, &m->d_ff) ||
		!cai_get_i32(r, &m->n_vocab) || !cai_get_i32(r, &m->trained_context) ||
		!cai_get_i32(r, &m->context_length) || !cai_get_u64(r, &n_params) ||
		!cai_get_u64(r, &m->weight_bytes) || !cai_get_u64(r, &m->kv_bytes_per_token) ||
		!cai_get_u64(r, &m->kv_window_bytes_per_token) || !cai_get_i32(r, &m->kv_window) ||
		!cai_get_u32(r, &m->gptq_rounding) ||
		!cai_get_u32(r, &m->two_digit_activations) ||
		!cai_get_u32(r, &m->file_weights) ||
		!cai_get_u32(r, &m->superblock_activations) ||
		!cai_get_f64(r, &m->load_seconds))
		return false;
	m->n_params = (int64_t) n_params;
	return true;
}

/*
 * The statistics, field by field: every field of cai_engine_stats is listed once here, as the
 * wire type it travels as.
 */
#define CAI_STATS_FIELDS(X) \
	X(i32, int32_t, running) \
	X(i32, int32_t, waiting) \
	X(u64, uint64_t, steps) \
	X(u64, uint64_t, step_sequences) \
	X(u64, uint64_t, prompt_tokens) \
	X(u64, uint64_t, prefill_tokens) \
	X(u64, uint64_t, generated_tokens) \
	X(u64, uint64_t, requests_finished) \
	X(u64, uint64_t, requests_cancelled) \
	X(u64, uint64_t, requests_rejected) \
	X(f64, double, busy_seconds) \
	X(f64, double, mean_service_ms) \
	X(u64, uint64_t, cache_lookups) \
	X(u64, uint64_t, cache_lookup_tokens) \
	X(u64, uint64_t, cache_hit_tokens) \
	X(u64, uint64_t, cache_evictions) \
	X(u64, uint64_t, cache_blocks) \
	X(u64, uint64_t, cache_bytes) \
	X(u64, uint64_t, cache_budget_bytes) \
	X(i32, int32_t, kv_blocks_total) \
	X(i32, int32_t, kv_blocks_free) \
	X(u64, uint64_t, kv_bytes_total) \
	X(u64, uint64_t, kv_bytes_used) \
	X(u64, uint64_t, kv_tokens_held) \
	X(u64, uint64_t, gemm_fallbacks) \
	X(u64, uint64_t, disk_hits) \
	X(u64, uint64_t, disk_hit_tokens) \
	X(u64, uint64_t, disk_bytes_read) \
	X(u64, uint64_t, disk_bytes_written) \
	X(u64, uint64_t, disk_writes_dropped) \
	X(u64, uint64_t, disk_evictions) \
	X(u64, uint64_t, disk_files) \
	X(u64, uint64_t, disk_bytes) \
	X(u64, uint64_t, disk_budget_bytes)

void
cai_wire_put_stats(cai_wbuf *w, const cai_engine_stats *s)
{
#define PUT_FIELD(wire, ctype, field) cai_put_##wire(w, (ctype) s->field);
	CAI_STATS_FIELDS(PUT_FIELD)
#undef PUT_FIELD
}

bool
cai_wire_get_stats(cai_reader *r, cai_engine_stats *s)
{
	memset(s, 0, sizeof(*s));
#define GET_FIELD(wire, ctype, field) \
	{ \
		ctype		v; \
		if (!cai_get_##wire(r, &v)) \
			return false; \
		s->field = v; \
	}
	CAI_STATS_FIELDS(GET_FIELD)
#undef GET_FIELD
	return true;
}

/* ---------------------------------------------------------------------------------------------
 * LOGPROBS messages
 * ------------------------------------------------------------------------------------------- */

void
cai_wire_put_logprobs(cai_wbuf *w, const cai_token_logprobs *lp)
{
	cai_put_f32(w, lp->logprob);
	cai_put_i32(w, lp->n_top);
	for (int i = 0; i < lp->n_top; i++)
	{
		cai_put_i32(w, lp->top_token[i]);
		cai_put_f32(w, lp->top_logprob[i]);
	}
}

bool
cai_wire_get_logprobs(cai_reader *r, cai_token_logprobs *lp)
{
	memset(lp, 0, sizeof(*lp));
	if (!cai_get_f32(r, &lp->logprob) || !cai_get_i32(r, &lp->n_top) || lp->n_top < 0 ||
		lp->n_top > CAI_TOP_LOGPROBS_MAX)
		return false;
	for (int i = 0; i < lp->n_top; i++)
		if (!cai_get_i32(r, &lp->top_token[i]) || !cai_get_f32(r, &lp->top_logprob[i]))
			return false;
	return true;
}
