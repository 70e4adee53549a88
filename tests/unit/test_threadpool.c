/*
 * test_threadpool.c — the thread pool runs every task index exactly once, inline for one
 * thread, and survives many tiny jobs back to back.
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#include "threadpool.h"
#include "test.h"

typedef struct count_arg
{
	atomic_int *hits;			/* per task */
	atomic_int	calls;
	int			n_threads;
	atomic_int	bad_thread;
} count_arg;

static void
count_task(void *p, int task, int thread)
{
	count_arg  *a = p;

	atomic_fetch_add(&a->hits[task], 1);
	atomic_fetch_add(&a->calls, 1);
	if (thread < 0 || thread >= a->n_threads)
		atomic_store(&a->bad_thread, 1);
}

/* Runs n_tasks on pool and checks each index ran once. */
static void
check_run(cai_threadpool *pool, int n_tasks)
{
	count_arg	a;
	int			wrong = 0;

	a.hits = calloc(n_tasks > 0 ? n_tasks : 1, sizeof(atomic_int));
	CHECK(a.hits != NULL);
	if (!a.hits)
		return;
	atomic_init(&a.calls, 0);
	atomic_init(&a.bad_thread, 0);
	a.n_threads = cai_threadpool_size(pool);
	cai_threadpool_run(pool, count_task, &a, n_tasks);
	for (int i = 0; i < n_tasks; i++)
		wrong += atomic_load(&a.hits[i]) != 1;
	CHECK_EQ_INT(wrong, 0);
	CHECK_EQ_INT(atomic_load(&a.calls), n_tasks > 0 ? n_tasks : 0);
	CHECK_EQ_INT(atomic_load(&a.bad_thread), 0);
	free(a.hits);
}

TEST(threadpool_every_task_once)
{
	for (int nt = 1; nt <= 4; nt++)
	{
		cai_threadpool *pool = cai_threadpool_create(nt);

		CHECK(pool != NULL);
		if (!pool)
			continue;
		CHECK_EQ_INT(cai_threadpool_size(pool), nt);
		check_run(pool, 0);
		check_run(pool, 1);
		check_run(pool, nt - 1 > 0 ? nt - 1 : 1);	/* fewer tasks than threads */
		check_run(pool, 7);
		check_run(pool, 1000);
		cai_threadpool_free(pool);
	}
	CHECK(cai_threadpool_create(0) == NULL);
	cai_threadpool_free(NULL);
}

/* Records which thread ran each task, to see that one thread runs inline on the caller. */
static void
thread_of_task(void *p, int task, int thread)
{
	((int *) p)[task] = thread;
}

TEST(threadpool_single_thread_inline)
{
	cai_threadpool *pool = cai_threadpool_create(1);
	int			thread[5] = {-1, -1, -1, -1, -1};

	CHECK(pool != NULL);
	cai_threadpool_run(pool, thread_of_task, thread, 5);
	for (int i = 0; i < 5; i++)
		CHECK_EQ_INT(thread[i], 0);
	/* a NULL pool means "run inline" as well */
	for (int i = 0; i < 5; i++)
		thread[i] = -1;
	cai_threadpool_run(NULL, thread_of_task, thread, 5);
	for (int i = 0; i < 5; i++)
		CHECK_EQ_INT(thread[i], 0);
	cai_threadpool_free(pool);
}

static void
add_task(void *p, int task, int thread)
{
	long	   *sums = p;

	sums[task] += task + 1;
}

/*
 * Many tiny jobs in a row, alternating task counts, with pauses that let the workers fall
 * asleep now and then: every job must see the previous one finished (the sums are plain
 * non-atomic adds, so a task run twice or a job overlapping the next would show).
 */
TEST(threadpool_many_tiny_jobs)
{
	cai_threadpool *pool = cai_threadpool_create(3);
	long		sums[8] = {0};
	long		expect[8] = {0};

	CHECK(pool != NULL);
	if (!pool)
		return;
	for (int job = 0; job < 20000; job++)
	{
		int			n = 1 + job % 8;

		cai_threadpool_run(pool, add_task, sums, n);
		for (int i = 0; i < n; i++)
			expect[i] += i + 1;
		if (job % 5000 == 4999)
		{
			struct timespec ts = {0, 20 * 1000 * 1000};

			nanosleep(&ts, NULL);	/* workers go to sleep; the next job must wake them */
		}
	}
	for (int i = 0; i < 8; i++)
		CHECK_EQ_INT(sums[i], expect[i]);
	cai_threadpool_free(pool);
}

typedef struct rendezvous
{
	atomic_int	arrived;
	atomic_int	met;			/* tasks that saw the other one arrive */
} rendezvous;

/* Each task waits (up to 5 s) for the other to start: only possible if they run in parallel. */
static void
meet_task(void *p, int task, int thread)
{
	rendezvous *r = p;
	struct timespec start,
				now;

	atomic_fetch_add(&r->arrived, 1);
	clock_gettime(CLOCK_MONOTONIC, &start);
	do
	{
		if (atomic_load(&r->arrived) >= 2)
		{
			atomic_fetch_add(&r->met, 1);
			return;
		}
		clock_gettime(CLOCK_MONOTONIC, &now);
	} while (now.tv_sec - start.tv_sec < 5);
}

/* A two-thread pool really runs two tasks at once, also after its workers went to sleep. */
TEST(threadpool_runs_in_parallel)
{
	cai_threadpool *pool = cai_threadpool_create(2);

	CHECK(pool != NULL);
	if (!pool)
		return;
	for (int round = 0; round < 3; round++)
	{
		rendezvous	r;

		atomic_init(&r.arrived, 0);
		atomic_init(&r.met, 0);
		cai_threadpool_run(pool, meet_task, &r, 2);
		CHECK_EQ_INT(atomic_load(&r.met), 2);
		if (round == 1)
		{
			struct timespec ts = {0, 50 * 1000 * 1000};

			nanosleep(&ts, NULL);	/* the worker blocks; the next job must wake it */
		}
	}
	cai_threadpool_free(pool);
}
