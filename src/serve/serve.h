/*
 * serve.h — the engine process: one model and one engine serving requests over a socket.
 *
 * PostgreSQL's engine worker starts `cai serve --fd N` (src/serve/cmd_serve.c), a process of its
 * own that attaches nothing of PostgreSQL's, and talks to it over a connected stream socket in
 * the frames of wire.h.  cai_serve() loads the model, says READY (the model it serves) or FAILED
 * (why not), then runs requests until the worker closes its end:
 *
 *   REQUEST  decode the payload (request_decode.c); answer tokenize, detokenize and cache reset
 *            at once; submit generations to the engine
 *   CANCEL   drop the request and free its KV now
 *   LIMITS   new admission limits (a configuration reload)
 *
 * While any request waits or runs it runs engine steps back to back, reading the socket between
 * steps, and sends each step's tokens as MESSAGE frames at once (tokens stream as they are
 * generated).  STATS frames go out at most every 100 ms, when the engine goes idle, and before
 * the messages of a step in which a generation finished, so that a backend that has its reply and
 * then reads pg_stat_cai sees counters that include it.
 *
 * A crash of this process costs only the requests it was running: the worker fails them, and
 * starts another.
 */
#ifndef CAI_SERVE_H
#define CAI_SERVE_H

#include "cai.h"

typedef struct cai_serve_config
{
	const char *model_path;
	cai_model_params model;
	cai_engine_params engine;
} cai_serve_config;

/*
 * Serves on fd until the peer closes it.  Returns 0 after a clean end, 1 when the model could
 * not be loaded (after the FAILED frame) or the peer broke the protocol.
 */
int			cai_serve(int fd, const cai_serve_config *config);

#endif							/* CAI_SERVE_H */
