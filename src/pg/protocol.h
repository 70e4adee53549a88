/*
 * protocol.h — how a backend hands a request to the engine worker.
 *
 * One request = one dynamic shared memory segment, laid out as
 *
 *     [CaiRequestHeader][payload (payload_size bytes)][response shm_mq (queue_size bytes)]
 *
 * The backend writes the header and the payload before it posts the segment's handle, so the
 * request needs no queue of its own: the worker reads it in place and relays the payload to the
 * engine process unread.  The response queue carries the engine's response messages, relayed by
 * the worker, plus the errors the worker answers itself.  The payload and the messages are in
 * the formats of src/common/wire.h.
 */
#ifndef PG_CAI_PROTOCOL_H
#define PG_CAI_PROTOCOL_H

#include "port/atomics.h"

#include "guc.h"
#include "wire.h"

#define CAI_REQUEST_MAGIC		0x52494143	/* "CAIR" */
#define CAI_RESPONSE_QUEUE_SIZE	(64 * 1024)

/* CaiRequestHeader.abandoned: why the backend left; any value but NO means it did */
#define CAI_ABANDONED_NO			0
#define CAI_ABANDONED_DETACHED		1	/* done, error, cancel, timeout */
#define CAI_ABANDONED_CLIENT_LOST	2	/* the backend's client went away */

typedef struct CaiRequestHeader
{
	uint32		magic;
	uint32		kind;			/* cai_request_kind */
	int			backend_pid;	/* for the worker's log lines */
	Oid			role;			/* whose share of the engine it takes (max_requests_per_role) */
	char		model[CAI_MODEL_NAME_MAX + 1];	/* the model that answers it (NUL-terminated) */
	Size		payload_offset;
	Size		payload_size;
	Size		queue_offset;
	Size		queue_size;
	/* set by the backend when it detaches (done, error, cancel): a CAI_ABANDONED_* value */
	pg_atomic_uint32 abandoned;
	/* the generation of the worker that took the request; 0 while it waits in the ring */
	pg_atomic_uint64 accepted_generation;
} CaiRequestHeader;

/* A wire buffer that grows in the current memory context (freed with it, on error too). */
extern void CaiWireInit(cai_wbuf *buf);

#endif							/* PG_CAI_PROTOCOL_H */
