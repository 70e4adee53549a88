/*
 * engine_process.h — the engine worker's engine process: started, spoken to, stopped.
 *
 * The worker starts the installed `cai` binary as "pg_cai engine serve --fd 3 ...": a fresh
 * exec, in a process group of its own, with the parent-death signal set (it dies with the
 * worker, and so with the postmaster), every signal back at its default and unblocked, and no
 * descriptor but its socket (fd 3), /dev/null as stdin and the server log as stdout and stderr.
 * It attaches nothing of PostgreSQL's shared memory.  The two talk in the frames of wire.h over
 * a stream socket pair; the worker's end never blocks.
 */
#ifndef PG_CAI_ENGINE_PROCESS_H
#define PG_CAI_ENGINE_PROCESS_H

#include <sys/types.h>

#include "wire.h"

typedef struct CaiEngineProcess
{
	pid_t		pid;			/* 0 when none runs */
	int			sock;			/* the worker's end; -1 when none */
	cai_wbuf	out;			/* frames not yet written */
	size_t		out_sent;		/* bytes of out already written */
	char	   *in;				/* bytes read, not yet taken as frames */
	size_t		in_len;
	size_t		in_cap;
	size_t		in_pos;			/* where the next frame starts */
	bool		closed;			/* the engine closed its end (it exited or is exiting) */
	bool		broken;			/* it sent a frame no engine may send */
} CaiEngineProcess;

extern void CaiEngineProcessInit(CaiEngineProcess *engine);

/*
 * Starts the engine binary at path with the arguments args (NULL-terminated; args[0] is the
 * process name).  False with the reason when it could not be executed.
 */
extern bool CaiEngineProcessStart(CaiEngineProcess *engine, const char *path, char *const *args,
								  char *reason, size_t reason_size);

/* Reads what the socket has, without waiting; sets closed on end of file or an error. */
extern void CaiEngineProcessRead(CaiEngineProcess *engine);

/*
 * The next whole frame read: true with its header and body (valid until the next read).  A
 * frame over the size limit sets broken.
 */
extern bool CaiEngineProcessNextFrame(CaiEngineProcess *engine, cai_frame_header *header,
									  const char **body);

/* Writes what it can of the queued frames without waiting; true when nothing is left. */
extern bool CaiEngineProcessWrite(CaiEngineProcess *engine);

/*
 * Ends the engine process and reaps it, describing how it ended in exit_text ("terminated by
 * signal 11: Segmentation fault", "exited with status 1").  Its socket is closed first; with
 * terminate (the worker asks it to go), it is sent SIGTERM if it has not exited a second later;
 * in any case it is killed if it has not exited after a few more seconds.  Returns the wait
 * status.
 */
extern int	CaiEngineProcessStop(CaiEngineProcess *engine, bool terminate, char *exit_text,
								 size_t exit_text_size);

#endif							/* PG_CAI_ENGINE_PROCESS_H */
