"""The types of graphd's Python API: the names of modes, roles and module
kinds as `Literal` types, and the records that calls return, as
`TypedDict`s. Their keys are the fields of graphd.h's structures, which are
also the keys of graphctl's JSON (docs/schemas); a time carries its unit in
its name (`_ms`, `_ns`).

Vocabulary (the same in Python, C, graphctl's JSON and the docs):

- ``socket_path``: the daemon's Unix socket (None: libgraphd's default,
  ``$GRAPHD_SOCKET``, ...).
- ``device_uuid``: the device a data session is bound to, by UUID.
- ``ordinal``: a CUDA device as this process numbers it.
- ``device``: as an argument, a GPU named the caller's way (a
  ``torch.device``, a CuPy device, a JAX or Warp device, or an ordinal);
  in a record, the daemon's own index of a device (``CaptureInfo.device``,
  ``SessionInfo.device``), which arguments call ``device_index``.
- ``arch``: a GPU architecture to compile for (90, "sm_90").
- Durations are integers with their unit: ``timeout_ms``,
  ``reconnect_ms``, ``idle_ms``, ``capture_ns``.
"""

from typing import Dict, List, Literal, TypedDict

#: How replays move data (graphd_mode).
Mode = Literal["staged", "staged_ex", "direct", "auto"]
#: What a slot is for (graphd_slot_role).
Role = Literal["input", "output", "inout", "scratch", "temp"]
#: The kind of code in a module (graphd_module_kind).
ModuleKind = Literal["ptx", "cubin", "fatbin", "host_elf"]
#: A session's kind.
SessionKind = Literal["control", "data"]
#: How graphd.jax.program_callable batches under vmap.
VmapMethod = Literal["sequential", "broadcast_all"]


class DeviceCounters(TypedDict):
    """graphd_device_counters: a device's counters since the daemon started."""
    sessions: int
    regions: int
    region_bytes: int
    captures: int
    replays: int
    errors: int
    recaptures: int
    inflight: int
    captures_built: int
    staging_bytes: int
    evictions: int
    replay_p50_ns: int
    replay_p90_ns: int
    replay_p99_ns: int
    replay_max_ns: int


class DeviceWork(TypedDict):
    """A device worker's time (graphd_device_work, with launch_ns,
    worker_busy_ns as busy_ns and worker_clock_ns as clock_ns from the
    device record).

    ``replay_ns`` over ``replays`` is its time in the replay path, of it
    ``launch_ns`` in the driver's graph launches; ``gpu_ns`` over
    ``gpu_replays`` the sampled GPU time. ``busy_ns`` is the time the
    worker thread has been at work (running jobs and ring replays, as
    against waiting for work) since it began serving, and ``clock_ns`` its
    clock, how long it has served, both read at one instant: between two
    statuses, the change in the one over the change in the other is the
    share of the time the worker was busy (near 1, the worker and not the
    device bounds the replay rate). Both 0 from a daemon that does not
    report them."""
    replay_ns: int
    replays: int
    gpu_ns: int
    gpu_replays: int
    launch_ns: int
    busy_ns: int
    clock_ns: int


class DeviceInfo(TypedDict):
    """graphd_device_info: one device of the daemon."""
    ordinal: int
    name: str
    uuid: bytes
    uuid_str: str
    total_memory: int
    free_memory: int
    backend: str
    epoch: int
    mps_enabled: int
    state: str
    counters: DeviceCounters


class DeviceStatus(DeviceInfo):
    """A device in Client.status(): its info, how old its figures are, its
    worker's time, and ``metrics``: every device counter of graphd's one
    list (proto/include/graphd/device_counters.def, as libgraphd's
    graphd_device_metric gives it) by its name, the keys of a device in
    ``graphctl stats --json``; a counter the list gains appears here with
    no change to this package."""
    figures_age_ms: int
    work: DeviceWork
    metrics: Dict[str, int]


class SessionInfo(TypedDict):
    """One open session: graphd_session_info's fields, and those of
    graphd_session_record past it, as the daemon's loop knew them when it
    answered (0 from a daemon that does not report them).

    ``gid`` is the peer's, from the kernel as ``pid`` and ``uid`` are.
    ``age_ms`` is the time since graphd accepted the connection;
    ``idle_ms`` since its last request came in or was answered, or it was
    seen with new or untaken ring entries or replays still running (while
    ``busy``, since the request being handled came in). ``admin`` (0 or 1):
    it may use admin-only requests. ``busy`` (0 or 1): a request of it is
    with a device's worker, held back, or waiting on the devices (the
    asker's own session is, asking for this status). ``flag_slots``: a data
    session's flag page slots, 0 before its first stream; ``has_ring`` (0
    or 1): a data session with a submission ring (asynchronous replays)."""
    id: int
    pid: int
    uid: int
    gid: int
    data: int
    device: int
    client_name: str
    regions: int
    region_bytes: int
    age_ms: int
    idle_ms: int
    admin: int
    busy: int
    flag_slots: int
    has_ring: int


class RequestCounters(TypedDict):
    """graphd_request_record: what the daemon counted of one kind of
    request since it started."""
    request: str
    calls: int
    errors: int
    handler_ns: int


class DaemonStatus(TypedDict):
    """Client.status(): the daemon, its devices, its sessions and its
    request counters."""
    version: str
    uptime_ms: int
    pid: int
    sessions: int
    modules: int
    module_bytes: int
    programs: int
    devices: List[DeviceStatus]
    session_info: List[SessionInfo]
    requests: List[RequestCounters]


class ReplayInfo(TypedDict):
    """What a replay reports (graphd_replay_info)."""
    captured: int
    capture_ns: int
    server_ns: int


class PrepareInfo(TypedDict):
    """What prepare_program reports (graphd_prepare_info)."""
    modules_loaded: int
    load_ns: int


class RegionRef(TypedDict):
    """A registered region (graphd_region_ref)."""
    region_id: int
    offset: int
    size: int
    import_ns: int


class CaptureInfo(TypedDict):
    """One capture (graphd_capture_record: its info and instances; graphctl
    list's JSON records).

    ``instances`` is how many instances the capture has (each with staging,
    executable graphs and an event of its own: one per stream replaying a
    program without state at once, or per session of a program with
    state); ``staging_bytes`` and ``graphs`` are over all of them, the
    staging with the temporaries it holds. ``queue_ns`` is the worker's
    time to queue one replay of it (launch, copies, node updates), a
    moving mean, 0 before the first."""
    program: str
    device: int
    mode: str
    instances: int
    staging_bytes: int
    nodes: int
    replays: int
    idle_ms: int
    pids: List[int]
    busy: bool
    generation: int
    created_unix_ms: int
    repoints: int
    graphs: int
    queue_ns: int


__all__ = ["Mode", "Role", "ModuleKind", "SessionKind", "VmapMethod", "DeviceCounters", "DeviceWork",
           "DeviceInfo", "DeviceStatus", "SessionInfo", "RequestCounters", "DaemonStatus", "ReplayInfo",
           "PrepareInfo", "RegionRef", "CaptureInfo"]
