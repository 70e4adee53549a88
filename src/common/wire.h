/*
 * wire.h — the byte formats a request travels in, from SQL to the engine process and back.
 *
 *   backend ──request payload (DSM segment)──▶ engine worker ──REQUEST frame (socket)──▶ engine
 *   backend ◀──response messages (shm_mq)──── engine worker ◀──MESSAGE frames (socket)── engine
 *
 * The request payload is written once, by the backend (src/pg), and read once, by the engine
 * process (request_decode.c); the worker relays it unread.  Response messages are written once,
 * by the engine process (serve.c), and read by the backend; the worker relays them too.  Frames
 * are what the worker and the engine process say to each other over their socket.
 *
 * Every value is written field by field in the host's byte order (both ends run on one machine,
 * from one build; the engine's READY frame carries CAI_WIRE_VERSION and the worker refuses
 * another).  Text is a uint32 length and the bytes, without a terminator.  Every read is
 * bounds-checked: no reader trusts a length it did not check against what it holds.  Nothing
 * here includes a PostgreSQL header.
 *
 * Request payload (the kind travels beside it: in the DSM header, then in the REQUEST frame):
 *   CHAT       generation, i32 n_messages, n_messages × turn
 *   COMPLETE   generation, text prompt
 *   TOKENIZE   text
 *   DETOKENIZE i32 count, count × i32 id
 *   CACHE_RESET (nothing)
 *   CACHE_FORGET u64 owner: the conversation whose cached blocks go (memory and disk)
 *   EMBED      i32 n_texts (1 .. CAI_EMBED_MAX_TEXTS), n_texts × text (each non-empty)
 * where
 *   generation = f32 temperature, f32 top_p, i32 top_k, u64 seed, i32 max_tokens, u8 truncate,
 *                u8 ignore_eos, u8 use_cache, u64 cache_salt, u64 cache_owner (the
 *                conversation, 0 for none), i32 n_stop, n_stop × text,
 *                u8 response_format (cai_response_format), text JSON schema (empty unless
 *                CAI_RESPONSE_JSON_SCHEMA), u8 json_whitespace (cai_json_whitespace),
 *                f32 presence_penalty, f32 frequency_penalty, f32 repetition_penalty, f32 min_p,
 *                i32 n_logit_bias, n_logit_bias × (i32 token, f32 bias), u8 logprobs,
 *                i32 top_logprobs, i32 n_samples
 *   turn       = i32 role (cai_role), text content, i32 n_tokens (-1: tokenize the content),
 *                n_tokens × i32 id
 *
 * Response messages (the first byte is the type; a request's last message is any but TOKEN):
 *   TOKEN  'T'  i32 token (-1: none, e.g. the end-of-turn token), text bytes to the end
 *   FINAL  'F'  final (see cai_wire_put_final), i32 × final.n_user_tokens
 *   ERROR  'E'  i32 status (a cai_status or CAI_WIRE_STATUS_*), message bytes to the end
 *   IDS    'I'  i32 count, count × i32 id
 *   TEXT   'X'  text bytes to the end
 *   OK     'K'  nothing
 *   LOGPROBS 'P' f32 logprob, i32 n_top, n_top × (i32 token, f32 logprob), text the token's
 *                bytes, n_top × text the listed tokens' bytes: the logprobs of the TOKEN message
 *                that follows it (only when the request asked for logprobs)
 *   SAMPLE 'N'  i32 sample: the TOKEN, LOGPROBS and SAMPLE_END messages after it, up to the next
 *                SAMPLE, are of that sample (only for requests of n_samples > 1)
 *   SAMPLE_END 'D' final of one sample (as FINAL's, without ids), which finished; the request
 *                goes on until its FINAL, sent once every sample has ended, with the usage of
 *                the whole request (the prompt once, the samples' completion tokens summed)
 *   EMBEDDINGS 'V' i32 n_texts, i32 dim, i32 prompt_tokens (all texts'), n_texts × dim × f32:
 *                an EMBED request's one answer, the vectors in the order of its texts
 *
 * Frames: a 16-byte header (u32 body length, u8 type, 3 zero bytes, u64 request id), then the
 * body.  Worker → engine: REQUEST (u32 kind, payload), CANCEL, LIMITS (i32 max_queue, f64
 * max_queue_wait_ms).  Engine → worker: READY (model summary), FAILED (text reason, text hint),
 * MESSAGE (a response message), STATS (engine statistics), LOG (text), HEARTBEAT (f64 the
 * longest step so far in seconds; sent by the step loop between steps and while idle, at least
 * every CAI_HEARTBEAT_INTERVAL_MS once READY is sent, so that silence means the loop is stuck;
 * before READY, every interval in which the model's load made progress, with 0).
 */
#ifndef CAI_WIRE_H
#define CAI_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cai.h"

#define CAI_WIRE_VERSION 11

/* The longest frame body either side accepts: a request with a whole long conversation fits. */
#define CAI_FRAME_MAX_BODY (64u * 1024 * 1024)
#define CAI_FRAME_HEADER_SIZE 16

/* The engine's step loop sends a HEARTBEAT at least this often, step length permitting */
#define CAI_HEARTBEAT_INTERVAL_MS 250

/* What a request asks for */
typedef enum cai_request_kind
{
	CAI_REQUEST_CHAT = 1,		/* chat turns -> template -> generation */
	CAI_REQUEST_COMPLETE,		/* raw text -> generation */
	CAI_REQUEST_TOKENIZE,		/* text -> token ids */
	CAI_REQUEST_DETOKENIZE,		/* token ids -> text */
	CAI_REQUEST_CACHE_RESET,	/* empty the prefix cache */
	CAI_REQUEST_EMBED,			/* texts -> one embedding each */
	CAI_REQUEST_CACHE_FORGET	/* drop one conversation's cached blocks */
} cai_request_kind;

/* The most texts one EMBED request may carry (its answer stays well inside a frame) */
#define CAI_EMBED_MAX_TEXTS 1024

/* What shape a generated reply must have */
typedef enum cai_response_format
{
	CAI_RESPONSE_TEXT = 0,		/* free text */
	CAI_RESPONSE_JSON_OBJECT,	/* any JSON object (OpenAI's "json_object") */
	CAI_RESPONSE_JSON_SCHEMA	/* a JSON value valid against a JSON Schema */
} cai_response_format;

/* Response message types: the first byte of every response message */
typedef enum cai_message_type
{
	CAI_MSG_TOKEN = 'T',
	CAI_MSG_FINAL = 'F',
	CAI_MSG_ERROR = 'E',
	CAI_MSG_IDS = 'I',
	CAI_MSG_TEXT = 'X',
	CAI_MSG_OK = 'K',
	CAI_MSG_LOGPROBS = 'P',
	CAI_MSG_SAMPLE = 'N',
	CAI_MSG_SAMPLE_END = 'D',
	CAI_MSG_EMBEDDINGS = 'V'
} cai_message_type;

/*
 * Statuses of ERROR messages that the engine worker sends itself, beside the engine's cai_status
 * values: no model; the engine process died with the request; the engine was stopped to apply a
 * configuration change before the request finished; the engine stopped responding and was killed.
 */
#define CAI_WIRE_STATUS_MODEL_UNAVAILABLE 1000
#define CAI_WIRE_STATUS_ENGINE_CRASHED 1001
#define CAI_WIRE_STATUS_ENGINE_RESTARTED 1002
/* the engine process sent nothing for pg_cai.engine_hang_timeout and was killed */
#define CAI_WIRE_STATUS_ENGINE_HUNG 1003

/* Frame types */
typedef enum cai_frame_type
{
	CAI_FRAME_REQUEST = 'R',
	CAI_FRAME_CANCEL = 'C',
	CAI_FRAME_LIMITS = 'L',
	CAI_FRAME_READY = 'Y',
	CAI_FRAME_FAILED = 'N',
	CAI_FRAME_MESSAGE = 'M',
	CAI_FRAME_STATS = 'S',
	CAI_FRAME_LOG = 'G',
	CAI_FRAME_HEARTBEAT = 'H'
} cai_frame_type;

/* ---------------------------------------------------------------------------------------------
 * Writing: a growable buffer.  By default it grows with realloc; a caller may give another
 * allocator (a PostgreSQL backend gives palloc's, so that an error frees it).  A failed
 * allocation sets failed and drops further writes, so callers check once at the end.
 * ------------------------------------------------------------------------------------------- */

typedef void *(*cai_wire_realloc_fn) (void *ptr, size_t size);

typedef struct cai_wbuf
{
	char	   *data;
	size_t		len;
	size_t		cap;
	bool		failed;
	cai_wire_realloc_fn grow;	/* NULL: realloc */
} cai_wbuf;

void		cai_wbuf_init(cai_wbuf *w, cai_wire_realloc_fn grow);
void		cai_wbuf_free(cai_wbuf *w);	/* only for the default allocator */
void		cai_wbuf_reset(cai_wbuf *w);	/* empties, keeps the memory */
void		cai_put_bytes(cai_wbuf *w, const void *data, size_t len);
void		cai_put_u8(cai_wbuf *w, uint8_t v);
void		cai_put_i32(cai_wbuf *w, int32_t v);
void		cai_put_u32(cai_wbuf *w, uint32_t v);
void		cai_put_u64(cai_wbuf *w, uint64_t v);
void		cai_put_f32(cai_wbuf *w, float v);
void		cai_put_f64(cai_wbuf *w, double v);
void		cai_put_text(cai_wbuf *w, const char *text, size_t len);

/* ---------------------------------------------------------------------------------------------
 * Reading: every function returns false, and reads nothing, when too few bytes are left.
 * ------------------------------------------------------------------------------------------- */

typedef struct cai_reader
{
	const char *data;
	size_t		len;
	size_t		pos;
} cai_reader;

void		cai_reader_init(cai_reader *r, const void *data, size_t len);
size_t		cai_reader_remaining(const cai_reader *r);
bool		cai_get_bytes(cai_reader *r, void *out, size_t len);
bool		cai_get_u8(cai_reader *r, uint8_t *v);
bool		cai_get_i32(cai_reader *r, int32_t *v);
bool		cai_get_u32(cai_reader *r, uint32_t *v);
bool		cai_get_u64(cai_reader *r, uint64_t *v);
bool		cai_get_f32(cai_reader *r, float *v);
bool		cai_get_f64(cai_reader *r, double *v);
/* Points *text at the next text in place (not NUL-terminated). */
bool		cai_get_text(cai_reader *r, const char **text, uint32_t *len);
/* Copies count ids; false for a negative count or too few bytes. */
bool		cai_get_i32_array(cai_reader *r, int32_t count, int32_t *out);

/* ---------------------------------------------------------------------------------------------
 * The request payload's generation block
 * ------------------------------------------------------------------------------------------- */

typedef struct cai_wire_generation
{
	float		temperature;
	float		top_p;
	int32_t		top_k;
	uint64_t	seed;
	int32_t		max_tokens;
	bool		truncate;		/* drop the oldest turns when the prompt is too long */
	bool		ignore_eos;
	bool		use_cache;
	uint64_t	cache_salt;
	uint64_t	cache_owner;	/* the conversation whose blocks the cache files it under */
	int32_t		n_stop;
	const char *stop[CAI_MAX_STOP_STRINGS]; /* writing: NUL-terminated strings */
	uint32_t	stop_len[CAI_MAX_STOP_STRINGS]; /* reading: stop[i] points into the payload */
	uint8_t		response_format;	/* cai_response_format */
	const char *schema;			/* JSON_SCHEMA: the schema's JSON text (writing: NUL-terminated;
								 * reading: points into the payload, schema_len bytes) */
	uint32_t	schema_len;
	uint8_t		json_whitespace;	/* cai_json_whitespace of a JSON reply */
	float		presence_penalty;
	float		frequency_penalty;
	float		repetition_penalty;
	float		min_p;
	int32_t		n_logit_bias;
	const cai_logit_bias *logit_bias;	/* writing: [n_logit_bias] */
	const char *logit_bias_bytes;	/* reading: n_logit_bias × 8 bytes in the payload */
	bool		logprobs;
	int32_t		top_logprobs;
	int32_t		n_samples;		/* parallel samples of the prompt (1 .. CAI_N_SAMPLES_MAX) */
} cai_wire_generation;

/* Zeroes g but for repetition_penalty and n_samples, whose defaults are 1: start here */
void		cai_wire_generation_init(cai_wire_generation *g);
void		cai_wire_put_generation(cai_wbuf *w, const cai_wire_generation *g);
/*
 * Reads the block; false for a short or ill-formed one (n_stop out of range, a flag not 0/1, an
 * unknown response format or whitespace).
 */
bool		cai_wire_get_generation(cai_reader *r, cai_wire_generation *g);
cai_logit_bias cai_wire_logit_bias_at(const cai_wire_generation *g, int i);

/*
 * A LOGPROBS message's numbers (after its type byte): the cai_token_logprobs of the TOKEN
 * message that follows it; the token texts follow them.  get: false for a short or ill-formed
 * one.
 */
void		cai_wire_put_logprobs(cai_wbuf *w, const cai_token_logprobs *lp);
bool		cai_wire_get_logprobs(cai_reader *r, cai_token_logprobs *lp);

/* A chat turn of a CHAT payload; tokens NULL (or n_tokens < 0): the engine tokenizes content. */
void		cai_wire_put_turn(cai_wbuf *w, int role, const char *content, size_t content_len,
							  const int32_t *tokens, int n_tokens);

/* ---------------------------------------------------------------------------------------------
 * Response messages
 * ------------------------------------------------------------------------------------------- */

/* What a finished generation reports: a FINAL message's body after its type byte */
typedef struct cai_wire_final
{
	int32_t		finish;			/* cai_finish_reason */
	int32_t		prompt_tokens;
	int32_t		cached_tokens;
	int32_t		completion_tokens;
	double		queue_ms;
	double		ttft_ms;
	double		total_ms;
	int32_t		first_message;	/* oldest turn kept after truncation (CHAT) */
	bool		tokens_exact;	/* the generated ids detokenize to exactly the returned text */
	int32_t		n_user_tokens;	/* ids of the last turn's content, as tokenized by the engine */
} cai_wire_final;

void		cai_wire_put_final(cai_wbuf *w, const cai_wire_final *f);
bool		cai_wire_get_final(cai_reader *r, cai_wire_final *f);

/* An ERROR message's body (after its type byte): the status, then the message */
void		cai_wire_put_error(cai_wbuf *w, int32_t status, const char *message);

/* ---------------------------------------------------------------------------------------------
 * Frames
 * ------------------------------------------------------------------------------------------- */

typedef struct cai_frame_header
{
	uint32_t	body_len;
	uint8_t		type;			/* cai_frame_type */
	uint64_t	id;				/* the request a frame is about; 0 for others */
} cai_frame_header;

/*
 * Starts a frame in w and returns where its header is: write the body, then end it with
 * cai_frame_end, which fills in the body's length.
 */
size_t		cai_frame_begin(cai_wbuf *w, cai_frame_type type, uint64_t id);
void		cai_frame_end(cai_wbuf *w, size_t start);

/*
 * Parses the header of the frame at the start of data[0..len).  Returns 1 with the header when
 * a whole frame is there (its body is data[CAI_FRAME_HEADER_SIZE..][0..body_len)), 0 when more
 * bytes are needed, -1 for a frame no peer may send (a body over CAI_FRAME_MAX_BODY).
 */
int			cai_frame_parse(const char *data, size_t len, cai_frame_header *header);

/* The model the engine process serves, sent in its READY frame */
typedef struct cai_wire_model
{
	uint32_t	version;		/* CAI_WIRE_VERSION of the engine binary */
	char		arch[32];
	char		name[128];
	char		chat_template[32];
	char		device[128];
	char		device_reason[256];
	int32_t		n_layers;
	int32_t		d_model;
	int32_t		n_heads;
	int32_t		n_kv_heads;
	int32_t		head_dim;
	int32_t		d_ff;
	int32_t		n_vocab;
	int32_t		trained_context;	/* the model's */
	int32_t		context_length; /* what the engine serves per sequence */
	int64_t		n_params;
	uint64_t	weight_bytes;
	uint64_t	kv_bytes_per_token;
	uint64_t	kv_window_bytes_per_token;	/* of which windowed layers' (kv.h) */
	int32_t		kv_window;
	uint32_t	gptq_rounding;	/* 0 or 1 */
	uint32_t	two_digit_activations;	/* 0 or 1 */
	uint32_t	file_weights;	/* 0 or 1: the GEMMs read the file's own formats */
	uint32_t	superblock_activations; /* 0 or 1: the file's K-quants' inputs per 256 */
	double		load_seconds;
} cai_wire_model;

void		cai_wire_put_model(cai_wbuf *w, const cai_wire_model *m);
/* Reads it; strings are cut to their fields and always NUL-terminated. */
bool		cai_wire_get_model(cai_reader *r, cai_wire_model *m);

void		cai_wire_put_stats(cai_wbuf *w, const cai_engine_stats *s);
bool		cai_wire_get_stats(cai_reader *r, cai_engine_stats *s);

#endif							/* CAI_WIRE_H */
