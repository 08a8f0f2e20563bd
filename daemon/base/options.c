/* Settings: defaults, the config file (parsed with inih) and flags share one
 * setter, so every setting has one name, one parser and one error text. */
#define _GNU_SOURCE
#include "options.h"

#include <errno.h>
#include <stddef.h>
#include <ini.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/listen.h"
#include "common/paths.h"
#include "graphd/frame.h"
#include "graphd/status.h"
#include "common/log.h"

void options_defaults(gd_options *o) {
  memset(o, 0, sizeof *o);
  if (gd_default_socket_path(o->socket_path, sizeof o->socket_path) < 0)
    snprintf(o->socket_path, sizeof o->socket_path, "%s", GD_SYSTEM_SOCKET);
  o->socket_mode = 0660;
  o->backend = GD_BACKEND_AUTO;
  o->host_memory = 1ull << 30;
  o->max_frame = GD_FRAME_DEFAULT_MAX;
  o->log_level = GD_INFO;
  snprintf(o->admin_group, sizeof o->admin_group, "graphd-admin");
  o->ready_timeout_s = 60;
  o->shutdown_grace_s = 10;
  o->hello_timeout_s = 10;
  o->idle_timeout_s = 0;
  o->max_connections = 4096;
  o->max_connections_per_uid = 1024;
  o->max_regions_per_session = 4096;
  o->max_regions_per_uid = 16384;
  o->max_programs = 65536;
  o->max_programs_per_uid = 8192;
  o->max_module_bytes = 8ull << 30;
  o->max_module_bytes_per_uid = 2ull << 30;
  o->max_program_bytes = 4ull << 30;
  o->max_program_bytes_per_uid = 1ull << 30;
  o->max_inflight_replays = 1024;
  o->gpu_time_sample = 16;   /* GD_GPU_SAMPLE_DEFAULT */
  o->ready_hold_rings = 2;   /* GD_READY_HOLD_RINGS_DEFAULT */
  o->ready_hold_max_us = 10; /* GD_READY_HOLD_MAX_US_DEFAULT */
  o->metrics_header_timeout_s = 5;
  o->metrics_per_address = 4;
  o->fair_shares = 1;
}

static int parse_int(const char *s, long lo, long hi, long *out);

/* The limits that are a count: name, where, the range (min 0: 0 turns
 * the limit off). */
typedef struct count_limit {
  const char *key;
  size_t off;
  long min, max;
} count_limit;

static const count_limit count_limits[] = {
    {"max-regions-per-session", offsetof(gd_options, max_regions_per_session), 1, 1 << 20},
    {"max-regions-per-uid", offsetof(gd_options, max_regions_per_uid), 0, 1 << 24},
    {"max-programs", offsetof(gd_options, max_programs), 1, 65536},
    {"max-programs-per-uid", offsetof(gd_options, max_programs_per_uid), 0, 65536},
    {"max-inflight-replays", offsetof(gd_options, max_inflight_replays), 1, 1 << 20},
    {"metrics-connections-per-address", offsetof(gd_options, metrics_per_address), 1, 64},
    {"max-host-maps", offsetof(gd_options, max_host_maps), 0, 1 << 30},
    {"gpu-time-sample", offsetof(gd_options, gpu_time_sample), 0, 1 << 20},
    {"ready-hold-rings", offsetof(gd_options, ready_hold_rings), 0, 1 << 16},
    {"ready-hold-max-us", offsetof(gd_options, ready_hold_max_us), 0, 1000000},
};

/* The limits that are a size, as count_limit. */
typedef struct size_limit {
  const char *key;
  size_t off;
  uint64_t min, max;
} size_limit;

static const size_limit size_limits[] = {
    {"max-region-bytes-per-uid", offsetof(gd_options, max_region_bytes_per_uid), 0, UINT64_MAX},
    {"max-region-bytes-per-session", offsetof(gd_options, max_region_bytes_per_session), 0,
     UINT64_MAX},
    {"max-module-bytes", offsetof(gd_options, max_module_bytes), 1u << 20, 8ull << 30},
    {"max-module-bytes-per-uid", offsetof(gd_options, max_module_bytes_per_uid), 0, 8ull << 30},
    {"max-program-bytes", offsetof(gd_options, max_program_bytes), 1u << 20, 8ull << 30},
    {"max-program-bytes-per-uid", offsetof(gd_options, max_program_bytes_per_uid), 0, 8ull << 30},
};

/* Sets a count or size limit named key; 1 when key is none of them. */
static int set_limit(gd_options *o, const char *key, const char *v, char *err, size_t errlen) {
  for (size_t i = 0; i < sizeof count_limits / sizeof count_limits[0]; i++) {
    const count_limit *l = &count_limits[i];
    if (strcmp(key, l->key) != 0) continue;
    long n;
    if (parse_int(v, l->min, l->max, &n) < 0) {
      snprintf(err, errlen, "%s: '%s' is not a number from %ld to %ld%s", key, v, l->min, l->max,
               l->min                                  ? ""
               : strcmp(key, "max-host-maps") == 0     ? " (0 = from vm.max_map_count)"
               : strcmp(key, "gpu-time-sample") == 0   ? " (1 = every replay, 0 = none)"
               : strcmp(key, "ready-hold-rings") == 0  ? " (0 = even a ring alone on its device)"
               : strcmp(key, "ready-hold-max-us") == 0 ? " (0 = hold no replay)"
                                                       : " (0 = no limit)");
      return -GRAPHD_INVALID_ARGUMENT;
    }
    *(uint32_t *)((char *)o + l->off) = (uint32_t)n;
    return 0;
  }
  for (size_t i = 0; i < sizeof size_limits / sizeof size_limits[0]; i++) {
    const size_limit *l = &size_limits[i];
    if (strcmp(key, l->key) != 0) continue;
    uint64_t sz;
    if (options_parse_size(v, &sz) < 0 || sz < l->min || sz > l->max) {
      snprintf(err, errlen, "%s: '%s' is not a size (e.g. 512M, 2G)%s", key, v,
               l->min ? " of at least 1M and at most 8G" : "; 0 = no limit");
      return -GRAPHD_INVALID_ARGUMENT;
    }
    *(uint64_t *)((char *)o + l->off) = sz;
    return 0;
  }
  return 1;
}

int options_parse_size(const char *s, uint64_t *out) {
  char *end;
  errno = 0;
  if (!*s || *s == '-') return -1;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || end == s) return -1;
  unsigned shift = 0;
  switch (*end) {
    case '\0': break;
    case 'k':
    case 'K':
      shift = 10;
      end++;
      break;
    case 'm':
    case 'M':
      shift = 20;
      end++;
      break;
    case 'g':
    case 'G':
      shift = 30;
      end++;
      break;
    case 't':
    case 'T':
      shift = 40;
      end++;
      break;
    default: return -1;
  }
  if (*end == 'i' || *end == 'B') end++;
  if (*end == 'B') end++;
  if (*end) return -1;
  if (shift && v > (UINT64_MAX >> shift)) return -1;
  *out = (uint64_t)v << shift;
  return 0;
}

static int parse_int(const char *s, long lo, long hi, long *out) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || end == s || *end || v < lo || v > hi) return -1;
  *out = v;
  return 0;
}

static int parse_seconds(const char *s, double *out) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || end == s || *end || !isfinite(v) || v < 0 || v > 1e9) return -1;
  *out = v;
  return 0;
}

static int copy_str(char *dst, size_t cap, const char *v) {
  size_t n = strlen(v);
  if (n >= cap) return -1;
  memcpy(dst, v, n + 1);
  return 0;
}

#define BAD(...)                                                                                   \
  do {                                                                                             \
    snprintf(err, errlen, __VA_ARGS__);                                                            \
    return -GRAPHD_INVALID_ARGUMENT;                                                               \
  } while (0)

int options_set(gd_options *o, const char *key, const char *v, char *err, size_t errlen) {
  long n;
  uint64_t sz;
  if (strcmp(key, "socket") == 0) {
    if (!*v || copy_str(o->socket_path, sizeof o->socket_path, v) < 0)
      BAD("socket: path must be 1 to %zu bytes", sizeof o->socket_path - 1);
  } else if (strcmp(key, "socket-mode") == 0) {
    char *end;
    unsigned long m = strtoul(v, &end, 8);
    if (!*v || *end || m > 0777) BAD("socket-mode: '%s' is not an octal mode like 0660", v);
    o->socket_mode = (unsigned)m;
  } else if (strcmp(key, "socket-group") == 0) {
    if (copy_str(o->socket_group, sizeof o->socket_group, v) < 0) BAD("socket-group: too long");
  } else if (strcmp(key, "backend") == 0) {
    if (strcmp(v, "auto") == 0)
      o->backend = GD_BACKEND_AUTO;
    else if (strcmp(v, "cuda") == 0)
      o->backend = GD_BACKEND_CUDA;
    else if (strcmp(v, "host") == 0)
      o->backend = GD_BACKEND_HOST;
    else
      BAD("backend: '%s' is not one of auto, cuda, host", v);
  } else if (strcmp(key, "host-devices") == 0) {
    if (parse_int(v, 1, 64, &n) < 0) BAD("host-devices: '%s' is not a number from 1 to 64", v);
    o->host_devices = (int)n;
  } else if (strcmp(key, "host-memory") == 0) {
    if (options_parse_size(v, &sz) < 0 || sz < (1u << 20))
      BAD("host-memory: '%s' is not a size of at least 1M (e.g. 512M, 4G)", v);
    o->host_memory = sz;
  } else if (strcmp(key, "host-busy-ms") == 0) {
    if (parse_int(v, 0, 60000, &n) < 0)
      BAD("host-busy-ms: '%s' is not a number of milliseconds from 0 to 60000", v);
    o->host_busy_ms = (uint32_t)n;
  } else if (strcmp(key, "devices") == 0) {
    if (copy_str(o->devices, sizeof o->devices, v) < 0) BAD("devices: list too long");
  } else if (strcmp(key, "max-frame") == 0) {
    if (options_parse_size(v, &sz) < 0 || sz < GD_FRAME_MIN_MAX || sz > GD_FRAME_LIMIT)
      BAD("max-frame: '%s' must be a size from %u to %u bytes", v, GD_FRAME_MIN_MAX,
          GD_FRAME_LIMIT);
    o->max_frame = (uint32_t)sz;
  } else if (strcmp(key, "log-level") == 0) {
    int l = gd_log_parse_level(v);
    if (l < 0) BAD("log-level: '%s' is not one of error, warn, info, debug", v);
    o->log_level = l;
  } else if (strcmp(key, "admin-group") == 0) {
    if (copy_str(o->admin_group, sizeof o->admin_group, v) < 0) BAD("admin-group: too long");
  } else if (strcmp(key, "device-budget") == 0) {
    if (options_parse_size(v, &sz) < 0)
      BAD("device-budget: '%s' is not a size (e.g. 2G, 512M; 0 = no limit)", v);
    o->device_budget = sz;
  } else if (strcmp(key, "ready-timeout") == 0) {
    if (parse_seconds(v, &o->ready_timeout_s) < 0)
      BAD("ready-timeout: '%s' is not a number of seconds (0 = never)", v);
  } else if (strcmp(key, "shutdown-grace") == 0) {
    if (parse_seconds(v, &o->shutdown_grace_s) < 0)
      BAD("shutdown-grace: '%s' is not a number of seconds", v);
  } else if (strcmp(key, "hello-timeout") == 0) {
    if (parse_seconds(v, &o->hello_timeout_s) < 0)
      BAD("hello-timeout: '%s' is not a number of seconds (0 = never)", v);
  } else if (strcmp(key, "idle-timeout") == 0) {
    if (parse_seconds(v, &o->idle_timeout_s) < 0)
      BAD("idle-timeout: '%s' is not a number of seconds (0 = never)", v);
  } else if (strcmp(key, "host-module-allow") == 0) {
    if (copy_str(o->host_module_allow, sizeof o->host_module_allow, v) < 0)
      BAD("host-module-allow: path too long");
  } else if (strcmp(key, "metrics-header-timeout") == 0) {
    if (parse_seconds(v, &o->metrics_header_timeout_s) < 0 || o->metrics_header_timeout_s < 0.1)
      BAD("metrics-header-timeout: '%s' is not a number of seconds (at least 0.1)", v);
  } else if (strcmp(key, "metrics-listen") == 0) {
    char host[sizeof o->metrics_listen], why[160];
    unsigned port;
    if (*v && gd_split_listen(v, host, sizeof host, &port, why, sizeof why) < 0)
      BAD("metrics-listen: %s", why);
    if (copy_str(o->metrics_listen, sizeof o->metrics_listen, v) < 0)
      BAD("metrics-listen: '%s' is too long", v);
  } else if (strcmp(key, "fair-shares") == 0) {
    if (strcmp(v, "yes") == 0 || strcmp(v, "true") == 0 || strcmp(v, "on") == 0 ||
        strcmp(v, "1") == 0)
      o->fair_shares = 1;
    else if (strcmp(v, "no") == 0 || strcmp(v, "false") == 0 || strcmp(v, "off") == 0 ||
             strcmp(v, "0") == 0)
      o->fair_shares = 0;
    else
      BAD("fair-shares: '%s' is not yes or no", v);
  } else if (strcmp(key, "max-connections") == 0 || strcmp(key, "max-connections-per-uid") == 0) {
    long conns;
    if (parse_int(v, 1, 1000000, &conns) < 0)
      BAD("%s: '%s' is not a number from 1 to 1000000", key, v);
    if (key[15] == '\0')
      o->max_connections = (uint32_t)conns;
    else
      o->max_connections_per_uid = (uint32_t)conns;
  } else {
    int rc = set_limit(o, key, v, err, errlen);
    if (rc <= 0) return rc;
    BAD("unknown setting '%s'", key);
  }
  return 0;
}

typedef struct ini_ctx {
  gd_options *o;
  char msg[256];
  int failed;
} ini_ctx;

/* inih reports the line of the first handler that returns 0; the message
 * is kept here and prefixed with "path:line" once parsing stops. */
static int ini_cb(void *user, const char *section, const char *name, const char *value) {
  ini_ctx *c = user;
  if (c->failed) return 1;
  if (section[0] && strcmp(section, "graphd") != 0) {
    snprintf(c->msg, sizeof c->msg, "unknown section [%s] (settings go in [graphd])", section);
    c->failed = 1;
    return 0;
  }
  if (options_set(c->o, name, value ? value : "", c->msg, sizeof c->msg) < 0) {
    c->failed = 1;
    return 0;
  }
  return 1;
}

int options_load_file(gd_options *o, const char *path, char *err, size_t errlen) {
  FILE *f = fopen(path, "r");
  if (!f) {
    snprintf(err, errlen, "cannot read config %s: %s", path, strerror(errno));
    return errno == ENOENT ? -GRAPHD_NOT_FOUND : -GRAPHD_PERMISSION_DENIED;
  }
  ini_ctx c = {.o = o};
  int rc = ini_parse_file(f, ini_cb, &c);
  fclose(f);
  if (c.failed) {
    snprintf(err, errlen, "%s:%d: %s", path, rc, c.msg);
    return -GRAPHD_INVALID_ARGUMENT;
  }
  if (rc != 0) {
    snprintf(err, errlen, "%s:%d: syntax error", path, rc);
    return -GRAPHD_INVALID_ARGUMENT;
  }
  return 0;
}

void options_print(const gd_options *o, int fd) {
  static const char *const backends[] = {"auto", "cuda", "host"};
  static const char *const levels[] = {"error", "warn", "info", "debug"};
  dprintf(fd,
          "socket = %s\nsocket-mode = %04o\nsocket-group = %s\nbackend = %s\n"
          "host-devices = %d\nhost-memory = %llu\nhost-busy-ms = %u\ndevices = %s\n"
          "max-frame = %u\n"
          "log-level = %s\nadmin-group = %s\ndevice-budget = %llu\nready-timeout = %g\n"
          "shutdown-grace = %g\nhello-timeout = %g\nidle-timeout = %g\nmax-connections = %u\n"
          "max-connections-per-uid = %u\n"
          "host-module-allow = %s\nmetrics-listen = %s\n",
          o->socket_path, o->socket_mode, o->socket_group, backends[o->backend], o->host_devices,
          (unsigned long long)o->host_memory, o->host_busy_ms, o->devices, o->max_frame,
          levels[o->log_level], o->admin_group, (unsigned long long)o->device_budget,
          o->ready_timeout_s, o->shutdown_grace_s, o->hello_timeout_s, o->idle_timeout_s,
          o->max_connections, o->max_connections_per_uid, o->host_module_allow, o->metrics_listen);
  for (size_t i = 0; i < sizeof count_limits / sizeof count_limits[0]; i++)
    dprintf(fd, "%s = %u\n", count_limits[i].key,
            *(const uint32_t *)((const char *)o + count_limits[i].off));
  dprintf(fd, "metrics-header-timeout = %g\n", o->metrics_header_timeout_s);
  dprintf(fd, "fair-shares = %s\n", o->fair_shares ? "yes" : "no");
  for (size_t i = 0; i < sizeof size_limits / sizeof size_limits[0]; i++)
    dprintf(fd, "%s = %llu\n", size_limits[i].key,
            (unsigned long long)*(const uint64_t *)((const char *)o + size_limits[i].off));
}
