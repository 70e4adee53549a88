/*
 * load_watch.h — the engine process's heartbeat while it loads its model.
 *
 * The step loop's heartbeats (serve.c) begin once the model is loaded, but a load can stall too:
 * a model file on a hung network mount, a device driver that never returns, a deadlock.  So
 * while the model loads, a thread of its own sends a HEARTBEAT frame every
 * CAI_HEARTBEAT_INTERVAL_MS in which the process made progress: its other threads used CPU
 * time, or it read from storage.  A stalled load uses neither, falls silent, and the worker
 * kills it after pg_cai.engine_hang_timeout as it kills a hung engine; a slow load that works
 * is never killed, however long it takes.
 */
#ifndef CAI_LOAD_WATCH_H
#define CAI_LOAD_WATCH_H

typedef struct cai_load_watch cai_load_watch;

/*
 * Starts the thread on the socket fd, which nothing else may write to until
 * cai_load_watch_stop.  NULL when it cannot start (the load then goes unwatched).
 */
cai_load_watch *cai_load_watch_start(int fd);

/* Stops the thread (at once) and frees it; NULL is fine. */
void		cai_load_watch_stop(cai_load_watch *w);

#endif							/* CAI_LOAD_WATCH_H */
