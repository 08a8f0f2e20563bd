/* The daemon's settings, from defaults, then the config file, then the
 * command line. Read-only once the loop runs. */
#ifndef GRAPHD_OPTIONS_H
#define GRAPHD_OPTIONS_H

#include <stdint.h>
#include <sys/types.h>

enum gd_backend_choice { GD_BACKEND_AUTO = 0, GD_BACKEND_CUDA, GD_BACKEND_HOST };

typedef struct gd_options {
  char socket_path[108]; /* sun_path size */
  unsigned socket_mode;  /* default 0660 */
  char socket_group[64]; /* empty: leave the group as created */
  int backend;           /* enum gd_backend_choice */
  int host_devices;      /* 0: not asked for */
  uint64_t host_memory;  /* bytes per host device */
  uint32_t host_busy_ms; /* host devices: a replay's capture stays busy this long after it ran */
  char devices[512];     /* --devices filter: ordinals or UUIDs, comma-separated */
  uint32_t max_frame;    /* payload cap in bytes */
  int log_level;
  char admin_group[64];              /* members may use admin-only control requests */
  uint64_t device_budget;            /* staging bytes of captures per device; 0 = no limit */
  double ready_timeout_s;            /* head-of-line ready timeout; 0 = never */
  double shutdown_grace_s;           /* how long shutdown waits for in-flight work */
  double hello_timeout_s;            /* a connection must say Hello within this; 0 = never */
  double idle_timeout_s;             /* a session with no request this long is closed; 0 = never */
  uint32_t max_connections;          /* sessions open at once, in all */
  uint32_t max_connections_per_uid;  /* ... per peer uid */
  uint64_t max_region_bytes_per_uid; /* bytes of regions one uid's sessions map; 0 = no limit */
  uint64_t max_region_bytes_per_session; /* ... one session maps; 0 = no limit */
  uint32_t max_regions_per_session;      /* regions one session holds */
  uint32_t max_regions_per_uid;          /* ... one uid's sessions hold; 0 = no limit */
  uint32_t max_programs;                 /* programs registered, in all */
  uint32_t max_programs_per_uid;         /* ... charged to one uid; 0 = no limit */
  uint64_t max_module_bytes;             /* module bytes registered, in all */
  uint64_t max_module_bytes_per_uid;     /* ... charged to one uid; 0 = no limit */
  uint64_t max_program_bytes;            /* program bytes (in memory) registered, in all */
  uint64_t max_program_bytes_per_uid;    /* ... charged to one uid; 0 = no limit */
  uint32_t max_inflight_replays;         /* replays queued on a session's stream, not done */
  uint32_t gpu_time_sample;              /* time one replay in this many on the GPU; 0 = none */
  uint32_t ready_hold_rings;             /* past this many rings, ready writes wait on the worker */
  uint32_t ready_hold_max_us;            /* ... for programs queued within this many us */
  uint32_t max_host_maps;                /* client mappings in all; 0: from vm.max_map_count */
  int fair_shares; /* 1 (default): a uid past its fair share of a tight pool is refused */
  char host_module_allow[256];     /* file of host module ids non-admins may register */
  char metrics_listen[128];        /* ADDR:PORT of the /metrics endpoint; empty: none */
  double metrics_header_timeout_s; /* an HTTP request's headers must be in by then */
  uint32_t metrics_per_address;    /* HTTP connections one address may hold */
} gd_options;

#include <stddef.h>

/* Fills in the built-in defaults. */
void options_defaults(gd_options *o);

/* Sets one setting by its long flag name ("socket", "max-frame", …), the
 * same names the config file uses. Returns 0, or -GRAPHD_INVALID_ARGUMENT
 * with err naming the setting and the accepted values. */
int options_set(gd_options *o, const char *key, const char *value, char *err, size_t errlen);

/* Reads an INI config file (settings in a [graphd] section, or before any
 * section). Returns 0; -GRAPHD_NOT_FOUND when the file does not exist;
 * -GRAPHD_INVALID_ARGUMENT with err giving "path:line: reason". */
int options_load_file(gd_options *o, const char *path, char *err, size_t errlen);

/* Parses "123", "64K", "4M", "2G" (powers of 1024). Returns 0 or -1. */
int options_parse_size(const char *s, uint64_t *out);

/* Writes the effective settings, one "key = value" per line. */
void options_print(const gd_options *o, int fd);
#endif
