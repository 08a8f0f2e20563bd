/* Prints the sizes and field offsets of libgraphd's public structures, one
 * "struct size N" or "struct.field offset N" per line, for the Python
 * bindings' layout test (client/python/tests/test_lib.py). */
#include <stddef.h>
#include <stdio.h>

#include "graphd/graphd.h"

#define SIZE(t) printf("%s size %zu\n", #t, sizeof(t))
#define OFF(t, f) printf("%s.%s offset %zu\n", #t, #f, offsetof(t, f))

int main(void) {
  SIZE(graphd_connect_options);
  OFF(graphd_connect_options, socket_path);
  OFF(graphd_connect_options, kind);
  OFF(graphd_connect_options, device_uuid);
  OFF(graphd_connect_options, timeout_ms);
  OFF(graphd_connect_options, client_name);
  SIZE(graphd_device_counters);
  OFF(graphd_device_counters, captures);
  OFF(graphd_device_counters, replays);
  OFF(graphd_device_counters, staging_bytes);
  OFF(graphd_device_counters, replay_max_ns);
  SIZE(graphd_device_info);
  OFF(graphd_device_info, name);
  OFF(graphd_device_info, uuid);
  OFF(graphd_device_info, uuid_str);
  OFF(graphd_device_info, total_memory);
  OFF(graphd_device_info, backend);
  OFF(graphd_device_info, epoch);
  OFF(graphd_device_info, mps_enabled);
  OFF(graphd_device_info, state);
  OFF(graphd_device_info, counters);
  SIZE(graphd_session_info);
  OFF(graphd_session_info, data);
  OFF(graphd_session_info, device);
  OFF(graphd_session_info, client_name);
  OFF(graphd_session_info, regions);
  SIZE(graphd_daemon_status);
  OFF(graphd_daemon_status, uptime_ms);
  OFF(graphd_daemon_status, pid);
  OFF(graphd_daemon_status, ndevices);
  OFF(graphd_daemon_status, devices);
  OFF(graphd_daemon_status, nsession_info);
  OFF(graphd_daemon_status, session_info);
  OFF(graphd_daemon_status, modules);
  OFF(graphd_daemon_status, programs);
  OFF(graphd_daemon_status, work);
  OFF(graphd_daemon_status, launch_ns);
  OFF(graphd_daemon_status, figures_age_ms);
  SIZE(graphd_latency_histogram);
  OFF(graphd_latency_histogram, le_ns);
  OFF(graphd_latency_histogram, le_count);
  OFF(graphd_latency_histogram, count);
  OFF(graphd_latency_histogram, sum_ns);
  SIZE(graphd_device_work);
  OFF(graphd_device_work, replays);
  SIZE(graphd_region_ref);
  OFF(graphd_region_ref, offset);
  OFF(graphd_region_ref, import_ns);
  SIZE(graphd_binding);
  OFF(graphd_binding, ptr);
  OFF(graphd_binding, bytes);
  SIZE(graphd_replay_info);
  OFF(graphd_replay_info, capture_ns);
  OFF(graphd_replay_info, server_ns);
  SIZE(graphd_prepare_info);
  OFF(graphd_prepare_info, load_ns);
  SIZE(graphd_capture_info);
  OFF(graphd_capture_info, staging_bytes);
  OFF(graphd_capture_info, replays);
  OFF(graphd_capture_info, idle_ms);
  OFF(graphd_capture_info, pids);
  OFF(graphd_capture_info, npids);
  OFF(graphd_capture_info, busy);
  OFF(graphd_capture_info, generation);
  OFF(graphd_capture_info, created_unix_ms);
  OFF(graphd_capture_info, repoints);
  OFF(graphd_capture_info, graphs);
  SIZE(graphd_device_record);
  OFF(graphd_device_record, index);
  OFF(graphd_device_record, info);
  OFF(graphd_device_record, work);
  OFF(graphd_device_record, launch_ns);
  OFF(graphd_device_record, figures_age_ms);
  OFF(graphd_device_record, replay_latency);
  OFF(graphd_device_record, staging_budget_bytes);
  OFF(graphd_device_record, instances);
  OFF(graphd_device_record, graphs);
  OFF(graphd_device_record, worker_busy_ns);
  OFF(graphd_device_record, worker_clock_ns);
  SIZE(graphd_session_record);
  OFF(graphd_session_record, index);
  OFF(graphd_session_record, info);
  OFF(graphd_session_record, age_ms);
  OFF(graphd_session_record, idle_ms);
  OFF(graphd_session_record, gid);
  OFF(graphd_session_record, flag_slots);
  OFF(graphd_session_record, admin);
  OFF(graphd_session_record, busy);
  OFF(graphd_session_record, has_ring);
  SIZE(graphd_metric_info);
  OFF(graphd_metric_info, field);
  OFF(graphd_metric_info, offset);
  OFF(graphd_metric_info, kind);
  OFF(graphd_metric_info, unit);
  OFF(graphd_metric_info, prometheus);
  OFF(graphd_metric_info, prometheus_own);
  OFF(graphd_metric_info, help);
  SIZE(graphd_request_record);
  OFF(graphd_request_record, request);
  OFF(graphd_request_record, calls);
  OFF(graphd_request_record, errors);
  OFF(graphd_request_record, handler_ns);
  SIZE(graphd_capture_record);
  OFF(graphd_capture_record, instances);
  OFF(graphd_capture_record, info);
  OFF(graphd_capture_record, queue_ns);
  SIZE(graphd_evict_options);
  OFF(graphd_evict_options, device);
  OFF(graphd_evict_options, client_pid);
  OFF(graphd_evict_options, session);
  OFF(graphd_evict_options, idle_ms);
  OFF(graphd_evict_options, all);
  OFF(graphd_evict_options, dry_run);
  return 0;
}
