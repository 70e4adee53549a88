/*
 * test_load_watch.c — the engine process's heartbeat while it loads (load_watch.h): it beats
 * while the process computes, and falls silent while the process only waits.
 */
#include "test.h"

#include <fcntl.h>
#include <stdbool.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "load_watch.h"
#include "wire.h"

/* Heartbeat frames waiting on fd (read without blocking); -1 on anything else. */
static int
heartbeats_waiting(int fd)
{
	char		buf[4096];
	size_t		have = 0;
	int			beats = 0;
	ssize_t		n;

	while ((n = recv(fd, buf + have, sizeof(buf) - have, MSG_DONTWAIT)) > 0)
		have += (size_t) n;
	for (size_t at = 0; at < have;)
	{
		cai_frame_header h;
		int			r = cai_frame_parse(buf + at, have - at, &h);

		if (r <= 0 || h.type != CAI_FRAME_HEARTBEAT)
			return -1;
		beats++;
		at += CAI_FRAME_HEADER_SIZE + h.body_len;
	}
	return beats;
}

/* Uses this thread's CPU for ms milliseconds of CPU time. */
static void
compute_for(int ms)
{
	struct timespec start,
				now;
	volatile unsigned long spin = 0;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &start);
	do
	{
		for (int i = 0; i < 100000; i++)
			spin++;
		clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
	} while ((now.tv_sec - start.tv_sec) * 1000 + (now.tv_nsec - start.tv_nsec) / 1000000 < ms);
}

TEST(load_watch_beats_only_while_the_load_progresses)
{
	int			sv[2];
	cai_load_watch *w;
	int			busy,
				idle;

	CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
	w = cai_load_watch_start(sv[0]);
	CHECK(w != NULL);
	/* four intervals' worth of work: the intervals it spans show progress */
	compute_for(4 * CAI_HEARTBEAT_INTERVAL_MS);
	busy = heartbeats_waiting(sv[1]);
	CHECK_MSG(busy >= 1, "%d heartbeats while computing", busy);
	/* the interval that saw the end of the work may still beat; none after it */
	usleep(2 * CAI_HEARTBEAT_INTERVAL_MS * 1000);
	(void) heartbeats_waiting(sv[1]);
	usleep(4 * CAI_HEARTBEAT_INTERVAL_MS * 1000);
	idle = heartbeats_waiting(sv[1]);
	CHECK_MSG(idle == 0, "%d heartbeats while only waiting", idle);
	cai_load_watch_stop(w);
	close(sv[0]);
	close(sv[1]);
}
