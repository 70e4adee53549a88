/*
 * guc.h — pg_cai's configuration settings (pg_cai.*).
 *
 * Settings that size shared memory are postmaster-level; those of the engine process are
 * reloadable (a reload starts a new engine with them).  Per-session settings are listed last.
 */
#ifndef PG_CAI_GUC_H
#define PG_CAI_GUC_H

/*
 * Models served at once, one engine process each.  Each engine holds its own weights, KV pool,
 * prefix cache and threads, so a handful is all one server can feed (a chat model, an embedding
 * model, a spare being swapped in); a fixed bound keeps the per-model state in shared memory
 * static.
 */
#define CAI_MAX_MODELS 4
/* a model's name: [a-z0-9_-]{1,CAI_MODEL_NAME_MAX} */
#define CAI_MODEL_NAME_MAX 32
/* the name of the one model that pg_cai.model configures when pg_cai.models is empty */
#define CAI_DEFAULT_MODEL_NAME "default"

/* One model to serve: its name (what calls pick it by) and its GGUF file as configured */
typedef struct CaiModelEntry
{
	char		name[CAI_MODEL_NAME_MAX + 1];
	char		path[MAXPGPATH];	/* as written; relative to the data directory unless absolute */
} CaiModelEntry;

/* The models to serve, the first being the default of calls that name none */
typedef struct CaiModelList
{
	int			n;
	CaiModelEntry entries[CAI_MAX_MODELS];
} CaiModelList;

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

/* postmaster-level: they size shared memory or the set of background workers */
extern int	cai_max_batch;
extern int	cai_max_queue;
extern char *cai_job_databases;
extern int	cai_job_workers;

/* reloadable: a change starts a new engine process with them */
extern char *cai_model_path;
extern char *cai_models_setting;	/* pg_cai.models: "name=path, ..." or empty */
extern char *cai_chat_template;
extern int	cai_device;
extern int	cai_weight_rounding;
extern char *cai_weights_cache;	/* pg_cai.weights_cache: a directory, or empty */
/* its default, relative to the data directory: base backups leave out names that begin with
 * pgsql_tmp (replica.c) */
#define CAI_WEIGHTS_CACHE_DEFAULT "pg_cai/pgsql_tmp"
extern int	cai_weights;		/* cai_weights_mode */
extern int	cai_activation_precision;
extern int	cai_threads;
extern int	cai_max_step_tokens;
extern int	cai_context_length;
extern int	cai_host_cache_size_mb;
extern char *cai_disk_cache_dir;	/* pg_cai.disk_cache_dir: a directory, or empty */
extern int	cai_disk_cache_size_mb;

/* reloadable: applied to the running engine */
extern int	cai_max_queue_wait_ms;
extern int	cai_reload_grace_ms;
extern int	cai_engine_hang_timeout_ms;
extern int	cai_max_requests_per_role;	/* 0: no limit */

/* superuser-settable */
extern int	cai_cache_isolation;
extern int	cai_max_request_messages;
extern int	cai_max_request_bytes;

/* per session */
extern int	cai_default_max_tokens;

extern void CaiGucInit(void);
extern const char *CaiDeviceSettingName(int device);
extern bool CaiModelsParse(const char *value, CaiModelList *list, char *error, int error_size);
extern void CaiModelsConfigured(CaiModelList *list);
extern int	CaiModelsFind(const CaiModelList *list, const char *name);
extern char *CaiModelsNames(const CaiModelList *list);

#endif							/* PG_CAI_GUC_H */
