/*
 * channel.h — a backend's side of a request to the engine worker.
 *
 * CaiChannelOpen posts a request and returns at once; CaiChannelReceive waits for the next
 * response message, serving interrupts (cancel, statement_timeout) and noticing a dead worker;
 * CaiChannelClose detaches, which tells the worker to drop whatever is left of the request.
 * An error raised while a channel is open detaches it too (the segment belongs to the current
 * resource owner), so the worker hears about every way a request can end.
 *
 * CaiGeneration wraps a channel for CHAT and COMPLETE requests: it collects the streamed text and
 * token ids and the final usage.
 */
#ifndef PG_CAI_CHANNEL_H
#define PG_CAI_CHANNEL_H

#include "fmgr.h"
#include "lib/stringinfo.h"
#include "storage/dsm.h"
#include "storage/shm_mq.h"

#include "pg_compat.h"
#include "protocol.h"

typedef struct CaiChannel
{
	dsm_segment *seg;
	CaiRequestHeader *header;
	shm_mq	   *mq;
	shm_mq_handle *mqh;
	TimestampTz worker_missing_since;	/* 0 while a worker is running */
	TimestampTz client_checked; /* when the client's socket was last looked at; 0: never */
} CaiChannel;

extern const char *CaiModelResolve(const char *requested);
extern const char *CaiModelArgument(FunctionCallInfo fcinfo, int argno);
extern void CaiCheckModelReady(const char *model);
extern void CaiCheckWorkerReady(void);
extern void CaiCheckRequestSize(Size bytes);
extern CaiChannel *CaiChannelOpen(cai_request_kind kind, const cai_wbuf *payload);
extern CaiChannel *CaiChannelOpenFor(cai_request_kind kind, const cai_wbuf *payload,
									 const char *model);
extern void CaiChannelReceive(CaiChannel *channel, char **data, Size *len);
extern void CaiChannelClose(CaiChannel *channel);
pg_noreturn extern void CaiRaiseWorkerError(const char *body, Size len);

/*
 * A generated token's logprobs with the bytes of each token they name (the backend has no
 * tokenizer): bytes[0] the token's own, bytes[1 + i] those of lp.top_token[i].  lp.n_top < 0:
 * the token came without logprobs.
 */
typedef struct CaiTokenLogprobs
{
	cai_token_logprobs lp;
	char	   *bytes[1 + CAI_TOP_LOGPROBS_MAX];
	int			bytes_len[1 + CAI_TOP_LOGPROBS_MAX];
} CaiTokenLogprobs;

typedef struct CaiGeneration
{
	CaiChannel *channel;
	StringInfoData text;		/* the reply so far */
	int32	   *ids;			/* generated ids so far */
	int			n_ids;
	int			ids_capacity;
	bool		done;
	cai_wire_final final;		/* valid once done */
	int32	   *user_tokens;	/* final.n_user_tokens ids, once done */
	CaiTokenLogprobs *logprobs; /* [n_ids] when the request asked for logprobs, else NULL */
	int			logprobs_capacity;
	bool		logprobs_pending;	/* a LOGPROBS message came; its TOKEN is next */
	CaiTokenLogprobs pending;

	/*
	 * A request of n_samples > 1: each sample's text, ids, logprobs and final (finish and
	 * completion tokens) are in samples[i], done when it ended; this one's final is the whole
	 * request's (the prompt once, completion tokens summed), and its text stays empty.
	 */
	int			n_samples;
	struct CaiGeneration *samples;
	int			current;		/* the sample the engine's last SAMPLE message named */
} CaiGeneration;

extern CaiGeneration *CaiGenerationStart(cai_request_kind kind, const cai_wbuf *payload);
extern CaiGeneration *CaiGenerationStartFor(cai_request_kind kind, const cai_wbuf *payload,
											const char *model, int n_samples);
extern bool CaiGenerationNext(CaiGeneration *gen, const char **piece, Size *len);
extern void CaiGenerationFinish(CaiGeneration *gen);

#endif							/* PG_CAI_CHANNEL_H */
