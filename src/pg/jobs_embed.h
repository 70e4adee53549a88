/*
 * jobs_embed.h — carrying out an 'embed' job of cai.jobs (jobs_embed.c), for the job runner.
 */
#ifndef PG_CAI_JOBS_EMBED_H
#define PG_CAI_JOBS_EMBED_H

/*
 * Inside the runner's transaction: embeds and stores the row's text of the claimed job (or
 * supersedes it by a newer pending or running job of the same row) and marks it done.  False
 * when the job is no longer this claim's (someone took it over).  Errors propagate.
 */
extern bool CaiAnswerEmbedJob(int64 job_id, int32 attempts);

#endif							/* PG_CAI_JOBS_EMBED_H */
