/*
 * protocol.h — what a backend and the engine worker say to each other.
 *
 * One request = one dynamic shared memory segment, laid out as
 *
 *     [CaiRequestHeader][payload (payload_size bytes)][response shm_mq (queue_size bytes)]
 *
 * The backend writes the header and the payload before it posts the segment's handle, so the
 * request needs no queue of its own: the worker reads it in place.  (DESIGN §3 sketches a request
 * queue too; a request is complete before it is posted, so a queue would only add a copy and a
 * round of synchronization.)  The response queue carries messages from the worker to the backend,
 * each starting with a CaiMessageType byte.
 *
 * The payload is a byte string written with CaiWriter and read back with CaiReader, which
 * bounds-checks every read: the worker never trusts a length it did not compute itself.
 */
#ifndef PG_CAI_PROTOCOL_H
#define PG_CAI_PROTOCOL_H

#include "port/atomics.h"
#include "lib/stringinfo.h"

#define CAI_REQUEST_MAGIC		0x52494143	/* "CAIR" */
#define CAI_RESPONSE_QUEUE_SIZE	(64 * 1024)

typedef enum CaiRequestKind
{
	CAI_REQUEST_CHAT = 1,		/* chat turns -> template -> generation */
	CAI_REQUEST_COMPLETE,		/* raw text -> generation */
	CAI_REQUEST_TOKENIZE,		/* text -> token ids */
	CAI_REQUEST_DETOKENIZE,		/* token ids -> text */
	CAI_REQUEST_CACHE_RESET		/* empty the prefix cache */
} CaiRequestKind;

typedef struct CaiRequestHeader
{
	uint32		magic;
	uint32		kind;			/* CaiRequestKind */
	int			backend_pid;	/* for the worker's log lines */
	Size		payload_offset;
	Size		payload_size;
	Size		queue_offset;
	Size		queue_size;
	/* set by the backend when it detaches (done, error, cancel) */
	pg_atomic_uint32 abandoned;
	/* the generation of the worker that took the request; 0 while it waits in the ring */
	pg_atomic_uint64 accepted_generation;
} CaiRequestHeader;

/*
 * Generation parameters (CHAT and COMPLETE).  Written as one fixed block at the start of the
 * payload; stop strings and the prompt follow.
 */
typedef struct CaiGenerationParams
{
	float		temperature;
	float		top_p;
	int32		top_k;
	uint64		seed;
	int32		max_tokens;
	bool		truncate;
	bool		ignore_eos;
	bool		use_cache;
	uint64		cache_salt;
	int32		n_stop;
	int32		n_messages;		/* CHAT: turns that follow the stop strings */
} CaiGenerationParams;

/* A turn's role, as sent (matches cai_role) */
#define CAI_TURN_SYSTEM		0
#define CAI_TURN_USER		1
#define CAI_TURN_ASSISTANT	2

/*
 * Status sent with CAI_MSG_ERROR when the worker has no model; other errors carry the engine's
 * cai_status.
 */
#define CAI_STATUS_MODEL_UNAVAILABLE 1000

/* Response message types: the first byte of every response message */
typedef enum CaiMessageType
{
	CAI_MSG_TOKEN = 'T',		/* int32 token id (-1: none), then the new text */
	CAI_MSG_FINAL = 'F',		/* CaiFinal, then the user turn's int32 ids */
	CAI_MSG_ERROR = 'E',		/* int32 cai_status, then the message text */
	CAI_MSG_IDS = 'I',			/* int32 count, then int32 ids */
	CAI_MSG_TEXT = 'X',			/* text */
	CAI_MSG_OK = 'K'			/* nothing more */
} CaiMessageType;

/* What a finished generation reports, after the CAI_MSG_FINAL byte */
typedef struct CaiFinal
{
	int32		finish;			/* cai_finish_reason */
	int32		prompt_tokens;
	int32		cached_tokens;
	int32		completion_tokens;
	double		queue_ms;
	double		ttft_ms;
	double		total_ms;
	int32		first_message;	/* oldest turn kept after truncation (CHAT) */
	bool		tokens_exact;	/* the generated ids detokenize to exactly the returned text */
	int32		n_user_tokens;	/* ids of the last turn's content, as tokenized by the worker */
} CaiFinal;

/* Serialization into a StringInfo (backend side) */
extern void cai_put_bytes(StringInfo buf, const void *data, Size len);
extern void cai_put_int32(StringInfo buf, int32 value);
extern void cai_put_text(StringInfo buf, const char *text, Size len);

/* Bounds-checked reads; every function returns false when the input is too short */
typedef struct CaiReader
{
	const char *data;
	Size		len;
	Size		pos;
} CaiReader;

extern void cai_reader_init(CaiReader *reader, const void *data, Size len);
extern Size cai_reader_remaining(const CaiReader *reader);
extern bool cai_get_bytes(CaiReader *reader, void *out, Size len);
extern bool cai_get_int32(CaiReader *reader, int32 *value);
extern bool cai_get_text(CaiReader *reader, const char **text, uint32 *len);
extern bool cai_get_int32_array(CaiReader *reader, int32 count, int32 *out);

#endif							/* PG_CAI_PROTOCOL_H */
