"""Every default of hvdlite, once: the driver's settings and the workers both read them here."""
START_TIMEOUT = 30.0  # seconds for a worker to start and meet the others
LIVENESS_TIMEOUT = 5.0  # seconds of heartbeat silence that mean a worker (or the driver) is gone
ELASTIC_TIMEOUT = 600.0  # seconds an elastic job waits for --min-np workers
DISCOVERY_TIMEOUT = 10.0  # seconds one run of the host discovery script may take
DISCOVERY_INTERVAL = 1.0  # seconds between runs of the host discovery script
COLLECTIVE_TIMEOUT = 30.0  # seconds a gloo collective waits for a peer (gloo's own default)
# Seconds a rank its peers wait on may make no progress before it is named hung, at least
# (driver/decisions/hangs.py derives the timeout from the job's stalls above it).
HANG_FLOOR = 10.0
# Seconds workers of a --checkpoint-dir job train on without a driver, from their last contact,
# before they exit (75) as a job without one does at --liveness-timeout: time for a supervisor
# or a person to run the same command again, which takes them over (docs/failover.md). Little is
# at stake in a long grace: rank 0 writes its commits all along, and the newest reaches the disk
# before the workers exit; what it costs is machines held by a job nobody drives, a failed peer
# held that long, and a hang no driver names.
DRIVER_GRACE = 60.0
# A rank whose own work per collective is this many times the others' median is a straggler.
STRAGGLER_FACTOR = 2.0
TIMEOUT_SCALE = 1.0  # what the timeouts' defaults above are multiplied by (hvdlite.timeouts)
HEARTBEAT_INTERVAL = 0.5  # seconds between a worker's heartbeats (rank 0's are faster)
PROBE_AFTER = 0.6  # seconds of heartbeat silence after which the driver probes the worker's node
PROBE_TIMEOUT = 0.4  # seconds a probe of a node waits for its kernel to answer a connect
EXIT_GRACE = 30.0  # seconds a worker that said it is exiting may take before it is killed
STOP_GRACE = 3.0  # seconds between TERM and KILL when a worker is stopped
# Seconds a graceful stop (a signal to the driver) waits for every worker to reach a commit and
# write the checkpoint: under Slurm's default KillWait (30 s) between SIGTERM and SIGKILL.
STOP_TIMEOUT = 25.0
BLACKLIST = "auto"  # which a failure takes out: "host", "slot", or "auto" (slot on one host)
# Seconds between checkpoint writes: a total loss costs at most this much training (plus one
# write), about what restarting a job costs anyway, while a large state is not rewritten at
# disk speed all the time. 0 writes every commit.
CHECKPOINT_INTERVAL = 10.0
CHECKPOINT_KEEP = 2  # the newest checkpoint and one before it, should the newest be damaged
