/*
 * guc.h — pg_cai's configuration settings (pg_cai.*).
 *
 * Settings that size shared memory, name files or start the engine are postmaster-level: the
 * engine worker reads them once at start.  Per-session settings are listed last.
 */
#ifndef PG_CAI_GUC_H
#define PG_CAI_GUC_H

/* pg_cai.device */
typedef enum CaiDeviceSetting
{
	CAI_DEVICE_AUTO,
	CAI_DEVICE_CPU,
	CAI_DEVICE_CUDA
} CaiDeviceSetting;

/* pg_cai.cache_isolation: which requests may share cached prompt prefixes */
typedef enum CaiCacheIsolation
{
	CAI_ISOLATION_ROLE,			/* requests of the same role */
	CAI_ISOLATION_CONVERSATION, /* turns of the same conversation */
	CAI_ISOLATION_NONE			/* everyone */
} CaiCacheIsolation;

/* postmaster-level: read by the engine worker at start */
extern char *cai_model_path;
extern char *cai_chat_template;
extern int	cai_device;
extern int	cai_threads;
extern int	cai_max_batch;
extern int	cai_max_step_tokens;
extern int	cai_context_length;
extern int	cai_host_cache_size_mb;
extern int	cai_max_queue;
extern char *cai_job_databases;
extern int	cai_job_workers;

/* reloadable: the worker applies it on SIGHUP */
extern int	cai_max_queue_wait_ms;

/* superuser-settable */
extern int	cai_cache_isolation;

/* per session */
extern int	cai_default_max_tokens;

extern void CaiGucInit(void);
extern const char *CaiDeviceSettingName(int device);

#endif							/* PG_CAI_GUC_H */
