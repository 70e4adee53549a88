/*
 * load_watch.c — see load_watch.h.
 */
#include "load_watch.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "wire.h"

/*
 * CPU time the other threads must have used in one interval to count as progress: more than a
 * stray wake-up of an idle thread, far less than any real work (1 % of the interval).
 */
#define PROGRESS_CPU_NS (CAI_HEARTBEAT_INTERVAL_MS * 10000LL)

struct cai_load_watch
{
	int			fd;
	pthread_t	thread;
	pthread_mutex_t lock;
	pthread_cond_t wake;
	bool		stop;
	int			io_fd;			/* /proc/self/io, or -1 where there is none */
	int64_t		last_cpu_ns;
	int64_t		last_read_bytes;
};

static int64_t
clock_ns(clockid_t clock)
{
	struct timespec ts;

	if (clock_gettime(clock, &ts) != 0)
		return 0;
	return (int64_t) ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* The process's CPU time without this thread's own (its reads of /proc cost some). */
static int64_t
others_cpu_ns(void)
{
	return clock_ns(CLOCK_PROCESS_CPUTIME_ID) - clock_ns(CLOCK_THREAD_CPUTIME_ID);
}

/* Bytes the process had read from storage (page faults on a mapped file included); -1: unknown. */
static int64_t
storage_read_bytes(int io_fd)
{
	char		buf[512];
	ssize_t		n;
	const char *field;

	if (io_fd < 0 || (n = pread(io_fd, buf, sizeof(buf) - 1, 0)) <= 0)
		return -1;
	buf[n] = '\0';
	field = strstr(buf, "\nread_bytes: ");
	return field ? strtoll(field + strlen("\nread_bytes: "), NULL, 10) : -1;
}

/* Whether the process moved since the last look. */
static bool
made_progress(cai_load_watch *w)
{
	int64_t		cpu = others_cpu_ns();
	int64_t		read_bytes = storage_read_bytes(w->io_fd);
	bool		moved = cpu - w->last_cpu_ns >= PROGRESS_CPU_NS ||
		(read_bytes >= 0 && read_bytes != w->last_read_bytes);

	w->last_cpu_ns = cpu;
	w->last_read_bytes = read_bytes;
	return moved;
}

/* One HEARTBEAT frame, whole: nothing else writes the socket meanwhile. */
static bool
send_heartbeat(int fd)
{
	cai_wbuf	out;
	size_t		frame;
	size_t		sent = 0;
	bool		ok = true;

	cai_wbuf_init(&out, NULL);
	frame = cai_frame_begin(&out, CAI_FRAME_HEARTBEAT, 0);
	cai_put_f64(&out, 0.0);		/* no step yet */
	cai_frame_end(&out, frame);
	ok = !out.failed;
	while (ok && sent < out.len)
	{
		ssize_t		n = send(fd, out.data + sent, out.len - sent, MSG_NOSIGNAL);

		if (n > 0)
			sent += (size_t) n;
		else if (!(n < 0 && errno == EINTR))
			ok = false;			/* the worker is gone: the load's end finds out */
	}
	cai_wbuf_free(&out);
	return ok;
}

static void *
watch_main(void *arg)
{
	cai_load_watch *w = arg;
	bool		alive = true;

	pthread_mutex_lock(&w->lock);
	while (!w->stop && alive)
	{
		struct timespec until;

		clock_gettime(CLOCK_REALTIME, &until);
		until.tv_nsec += (long) CAI_HEARTBEAT_INTERVAL_MS * 1000000L;
		until.tv_sec += until.tv_nsec / 1000000000L;
		until.tv_nsec %= 1000000000L;
		while (!w->stop && pthread_cond_timedwait(&w->wake, &w->lock, &until) != ETIMEDOUT)
			;
		if (w->stop)
			break;
		pthread_mutex_unlock(&w->lock);
		if (made_progress(w))
			alive = send_heartbeat(w->fd);
		pthread_mutex_lock(&w->lock);
	}
	pthread_mutex_unlock(&w->lock);
	return NULL;
}

cai_load_watch *
cai_load_watch_start(int fd)
{
	cai_load_watch *w = calloc(1, sizeof(*w));

	if (!w)
		return NULL;
	w->fd = fd;
	w->io_fd = open("/proc/self/io", O_RDONLY | O_CLOEXEC);
	w->last_cpu_ns = others_cpu_ns();
	w->last_read_bytes = storage_read_bytes(w->io_fd);
	pthread_mutex_init(&w->lock, NULL);
	pthread_cond_init(&w->wake, NULL);
	if (pthread_create(&w->thread, NULL, watch_main, w) != 0)
	{
		fprintf(stderr, "pg_cai engine: could not start the load watch thread: %s\n",
				strerror(errno));
		if (w->io_fd >= 0)
			close(w->io_fd);
		pthread_cond_destroy(&w->wake);
		pthread_mutex_destroy(&w->lock);
		free(w);
		return NULL;
	}
	return w;
}

void
cai_load_watch_stop(cai_load_watch *w)
{
	if (!w)
		return;
	pthread_mutex_lock(&w->lock);
	w->stop = true;
	pthread_cond_signal(&w->wake);
	pthread_mutex_unlock(&w->lock);
	(void) pthread_join(w->thread, NULL);
	if (w->io_fd >= 0)
		close(w->io_fd);
	pthread_cond_destroy(&w->wake);
	pthread_mutex_destroy(&w->lock);
	free(w);
}
