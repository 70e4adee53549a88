/*
 * threadpool.c — persistent worker threads for the engine's data-parallel loops.
 *
 * A decode step runs a couple of hundred small parallel loops (one per matrix product), so the
 * dispatch has to cost microseconds, not the tens of microseconds of a condition-variable
 * round trip.  Workers therefore spin for a short while after each job, watching one atomic
 * word, and only then sleep on a condition variable; the caller works on the job itself.
 *
 * The job is published through `ticket`, a 64-bit word holding (generation << 32 | next task).
 * Odd generations are live jobs, even ones mean "no job".  A thread claims task i with a
 * compare-and-swap from (g, i) to (g, i + 1), so a thread that read a stale generation can never
 * claim a task of a later job: its swap fails and it re-reads.  Between jobs the caller parks
 * the ticket on an even generation before rewriting the job description, so a thread that read
 * a half-written description cannot succeed in claiming either.  The caller returns once every
 * task has finished (done == n_tasks), without waiting for workers that never woke up.
 *
 * Sleeping uses Dekker-style handshakes with sequentially consistent atomics: a sleeper
 * announces itself (sleepers / caller_waiting) and then re-checks the condition under the
 * mutex; the waker changes the condition and then checks for sleepers, taking the mutex to
 * broadcast.  At least one side always sees the other, so no wake-up is lost.
 */
#include "threadpool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/*
 * Spin iterations before a thread blocks: each is a pause instruction (25 ns on Zen 4, up to
 * ~40 ns on recent Intel), so about 100-160 us, longer than the gaps between the matrix
 * products of one decode step but short enough not to burn a core while idle.
 */
#define SPIN_ITERATIONS 4000

typedef struct worker_arg
{
	struct cai_threadpool *pool;
	int			thread;			/* 1..n_threads-1; the caller is thread 0 */
} worker_arg;

struct cai_threadpool
{
	int			n_threads;
	pthread_t  *threads;		/* n_threads - 1 workers */
	worker_arg *worker_args;
	int			n_started;		/* workers actually created */

	/*
	 * What spinning workers watch, on one cache line: the current job (written by the caller
	 * while the ticket's generation is even), the ticket and the stop flag.
	 */
	_Alignas(64) atomic_uint_fast64_t ticket;	/* generation << 32 | next unclaimed task */
	_Atomic(cai_task_fn) fn;
	_Atomic(void *) arg;
	atomic_int	n_tasks;
	atomic_bool stop;
	atomic_int	sleepers;		/* workers blocked (or about to block) on work_cv */

	/* What workers write as they finish, on its own line. */
	_Alignas(64) atomic_int done;	/* tasks finished in the current job */
	atomic_bool caller_waiting; /* the caller blocked (or about to block) on done_cv */

	_Alignas(64) uint32_t generation;	/* caller-private copy of the ticket's generation */
	pthread_mutex_t mutex;
	pthread_cond_t work_cv;
	pthread_cond_t done_cv;
};

static inline void
cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ __volatile__("yield");
#endif
}

static inline uint32_t
ticket_generation(uint64_t ticket)
{
	return (uint32_t) (ticket >> 32);
}

/*
 * Claims and runs tasks of the job with generation `gen` until none is left or the job is
 * replaced.  Returns after the last claim attempt.
 */
static void
run_tasks(cai_threadpool *pool, uint32_t gen, int thread)
{
	cai_task_fn fn = atomic_load_explicit(&pool->fn, memory_order_relaxed);
	void	   *arg = atomic_load_explicit(&pool->arg, memory_order_relaxed);
	int			n_tasks = atomic_load_explicit(&pool->n_tasks, memory_order_relaxed);
	uint64_t	cur = atomic_load_explicit(&pool->ticket, memory_order_acquire);

	while (ticket_generation(cur) == gen && (int) (uint32_t) cur < n_tasks)
	{
		if (atomic_compare_exchange_weak_explicit(&pool->ticket, &cur, cur + 1,
												  memory_order_acq_rel,
												  memory_order_acquire))
		{
			fn(arg, (int) (uint32_t) cur, thread);
			if (atomic_fetch_add(&pool->done, 1) + 1 == n_tasks &&
				atomic_load(&pool->caller_waiting))
			{
				pthread_mutex_lock(&pool->mutex);
				pthread_cond_broadcast(&pool->done_cv);
				pthread_mutex_unlock(&pool->mutex);
			}
			cur = atomic_load_explicit(&pool->ticket, memory_order_acquire);
		}
	}
}

/* A worker: wait for a live generation it has not served yet, help with it, repeat. */
static void *
worker_main(void *p)
{
	worker_arg *wa = p;
	cai_threadpool *pool = wa->pool;
	uint32_t	served = 0;

	for (;;)
	{
		uint64_t	t = 0;
		uint32_t	gen = 0;
		bool		found = false;

		for (int spin = 0; spin < SPIN_ITERATIONS; spin++)
		{
			if (atomic_load_explicit(&pool->stop, memory_order_relaxed))
				return NULL;
			t = atomic_load_explicit(&pool->ticket, memory_order_acquire);
			gen = ticket_generation(t);
			if ((gen & 1) && gen != served)
			{
				found = true;
				break;
			}
			cpu_relax();
		}
		if (!found)
		{
			pthread_mutex_lock(&pool->mutex);
			atomic_fetch_add(&pool->sleepers, 1);
			for (;;)
			{
				if (atomic_load(&pool->stop))
				{
					atomic_fetch_sub(&pool->sleepers, 1);
					pthread_mutex_unlock(&pool->mutex);
					return NULL;
				}
				t = atomic_load(&pool->ticket);
				gen = ticket_generation(t);
				if ((gen & 1) && gen != served)
					break;
				pthread_cond_wait(&pool->work_cv, &pool->mutex);
			}
			atomic_fetch_sub(&pool->sleepers, 1);
			pthread_mutex_unlock(&pool->mutex);
		}
		run_tasks(pool, gen, wa->thread);
		served = gen;
	}
}

/* Creates a pool of n_threads (the caller included); NULL on failure. */
cai_threadpool *
cai_threadpool_create(int n_threads)
{
	cai_threadpool *pool;

	if (n_threads < 1)
		return NULL;
	/* aligned so that the cache-line separation of the hot fields holds */
	pool = aligned_alloc(64, (sizeof(*pool) + 63) & ~(size_t) 63);
	if (!pool)
		return NULL;
	memset(pool, 0, sizeof(*pool));
	pool->n_threads = n_threads;
	atomic_init(&pool->fn, NULL);
	atomic_init(&pool->arg, NULL);
	atomic_init(&pool->n_tasks, 0);
	atomic_init(&pool->ticket, 0);
	atomic_init(&pool->done, 0);
	atomic_init(&pool->stop, false);
	atomic_init(&pool->sleepers, 0);
	atomic_init(&pool->caller_waiting, false);
	if (pthread_mutex_init(&pool->mutex, NULL) != 0)
	{
		free(pool);
		return NULL;
	}
	if (pthread_cond_init(&pool->work_cv, NULL) != 0)
	{
		pthread_mutex_destroy(&pool->mutex);
		free(pool);
		return NULL;
	}
	if (pthread_cond_init(&pool->done_cv, NULL) != 0)
	{
		pthread_cond_destroy(&pool->work_cv);
		pthread_mutex_destroy(&pool->mutex);
		free(pool);
		return NULL;
	}
	if (n_threads > 1)
	{
		pool->threads = calloc(n_threads - 1, sizeof(pthread_t));
		pool->worker_args = calloc(n_threads - 1, sizeof(worker_arg));
		if (!pool->threads || !pool->worker_args)
		{
			cai_threadpool_free(pool);
			return NULL;
		}
		for (int i = 0; i < n_threads - 1; i++)
		{
			pool->worker_args[i].pool = pool;
			pool->worker_args[i].thread = i + 1;
			if (pthread_create(&pool->threads[i], NULL, worker_main, &pool->worker_args[i]) != 0)
			{
				cai_threadpool_free(pool);
				return NULL;
			}
			pool->n_started++;
		}
	}
	return pool;
}

/* Stops and joins the workers and frees the pool (NULL is fine). */
void
cai_threadpool_free(cai_threadpool *pool)
{
	if (!pool)
		return;
	pthread_mutex_lock(&pool->mutex);
	atomic_store(&pool->stop, true);
	pthread_cond_broadcast(&pool->work_cv);
	pthread_mutex_unlock(&pool->mutex);
	for (int i = 0; i < pool->n_started; i++)
		pthread_join(pool->threads[i], NULL);
	pthread_cond_destroy(&pool->done_cv);
	pthread_cond_destroy(&pool->work_cv);
	pthread_mutex_destroy(&pool->mutex);
	free(pool->worker_args);
	free(pool->threads);
	free(pool);
}

int
cai_threadpool_size(const cai_threadpool *pool)
{
	return pool ? pool->n_threads : 1;
}

/*
 * Runs fn(arg, task, thread) for every task in [0, n_tasks) and returns when all are done.
 * A NULL pool, a one-thread pool or a single task runs inline on the caller.  Not reentrant:
 * one caller at a time per pool, and fn must not call back into the same pool.
 */
void
cai_threadpool_run(cai_threadpool *pool, cai_task_fn fn, void *arg, int n_tasks)
{
	uint32_t	gen;

	if (n_tasks <= 0)
		return;
	if (!pool || pool->n_threads == 1 || n_tasks == 1)
	{
		for (int i = 0; i < n_tasks; i++)
			fn(arg, i, 0);
		return;
	}

	/* The ticket is parked on an even generation here, so nobody can claim while we write. */
	atomic_store_explicit(&pool->fn, fn, memory_order_relaxed);
	atomic_store_explicit(&pool->arg, arg, memory_order_relaxed);
	atomic_store_explicit(&pool->n_tasks, n_tasks, memory_order_relaxed);
	atomic_store_explicit(&pool->done, 0, memory_order_relaxed);
	gen = pool->generation + 1; /* odd: live */
	atomic_store(&pool->ticket, (uint64_t) gen << 32);
	if (atomic_load(&pool->sleepers) > 0)
	{
		pthread_mutex_lock(&pool->mutex);
		pthread_cond_broadcast(&pool->work_cv);
		pthread_mutex_unlock(&pool->mutex);
	}

	run_tasks(pool, gen, 0);

	/* Every task is claimed; wait for the ones other threads are still running. */
	for (int spin = 0; spin < SPIN_ITERATIONS; spin++)
	{
		if (atomic_load_explicit(&pool->done, memory_order_acquire) == n_tasks)
			break;
		cpu_relax();
	}
	if (atomic_load_explicit(&pool->done, memory_order_acquire) != n_tasks)
	{
		pthread_mutex_lock(&pool->mutex);
		atomic_store(&pool->caller_waiting, true);
		while (atomic_load(&pool->done) != n_tasks)
			pthread_cond_wait(&pool->done_cv, &pool->mutex);
		atomic_store(&pool->caller_waiting, false);
		pthread_mutex_unlock(&pool->mutex);
	}

	/* Park the ticket (even generation) before the next job's description is written. */
	pool->generation = gen + 1;
	atomic_store(&pool->ticket, (uint64_t) pool->generation << 32);
}
