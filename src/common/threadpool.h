/*
 * threadpool.h — a fixed pool of worker threads for data-parallel loops.
 *
 * cai_threadpool_run splits n_tasks task indices over the pool (the calling thread works too)
 * and returns when all are done.  Which thread runs which task does not change results: kernels
 * give each task a disjoint slice of the output and never reduce across tasks.
 */
#ifndef CAI_THREADPOOL_H
#define CAI_THREADPOOL_H

typedef struct cai_threadpool cai_threadpool;

/* task: which index of the loop; thread: 0..n_threads-1 (for per-thread scratch). */
typedef void (*cai_task_fn) (void *arg, int task, int thread);

/* n_threads >= 1 (the caller counts as one); NULL on failure. */
cai_threadpool *cai_threadpool_create(int n_threads);
void		cai_threadpool_free(cai_threadpool *pool);
int			cai_threadpool_size(const cai_threadpool *pool);
void		cai_threadpool_run(cai_threadpool *pool, cai_task_fn fn, void *arg, int n_tasks);

#endif							/* CAI_THREADPOOL_H */
