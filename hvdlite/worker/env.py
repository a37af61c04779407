"""Names of the environment variables the driver hands to every worker."""

RANK = "HVDLITE_RANK"
SIZE = "HVDLITE_SIZE"
LOCAL_RANK = "HVDLITE_LOCAL_RANK"
LOCAL_SIZE = "HVDLITE_LOCAL_SIZE"
CROSS_RANK = "HVDLITE_CROSS_RANK"
CROSS_SIZE = "HVDLITE_CROSS_SIZE"
HOSTNAME = "HVDLITE_HOSTNAME"
RENDEZVOUS_ADDR = "HVDLITE_RENDEZVOUS_ADDR"
RENDEZVOUS_PORT = "HVDLITE_RENDEZVOUS_PORT"
SECRET = "HVDLITE_SECRET"
CLAIM = "HVDLITE_CLAIM"  # in place of SECRET where the launch crosses a readable network (claim.py)
ROUND = "HVDLITE_ROUND"  # rendezvous round the initial assignment belongs to
SLOT = "HVDLITE_SLOT"  # stable identity of the worker's slot, "host/index"
WORKER = "HVDLITE_WORKER_ID"  # this launch of the slot, "host/index#generation"
ELASTIC = "HVDLITE_ELASTIC"
COLLECTIVE_TIMEOUT = "HVDLITE_COLLECTIVE_TIMEOUT"  # seconds
LIVENESS_TIMEOUT = "HVDLITE_LIVENESS_TIMEOUT"  # seconds
START_TIMEOUT = "HVDLITE_START_TIMEOUT"  # seconds to form the first world
CHECKPOINT_DIR = "HVDLITE_CHECKPOINT_DIR"  # where rank 0 writes commits; unset: nowhere
CHECKPOINT_INTERVAL = "HVDLITE_CHECKPOINT_INTERVAL"  # seconds between checkpoint writes
CHECKPOINT_KEEP = "HVDLITE_CHECKPOINT_KEEP"  # checkpoints kept
CHECKPOINT_LINEAGE = "HVDLITE_CHECKPOINT_LINEAGE"  # --fresh: the new lineage; unset: resume the newest
TIMELINE = "HVDLITE_TIMELINE"  # collective trace file (--timeline-filename); unset: none
DRIVER_GRACE = "HVDLITE_DRIVER_GRACE"  # seconds to train on without a driver (--driver-grace)
DRIVER_EPOCH = "HVDLITE_DRIVER_EPOCH"  # the launching driver's lease epoch (worker/beacon.py)
TEMPLATE = "HVDLITE_TEMPLATE"  # set in a template process: a module that must run in each worker refuses preloading

# Horovod's names for the same facts, for scripts written for horovodrun.
HOROVOD = {RANK: "HOROVOD_RANK", SIZE: "HOROVOD_SIZE", LOCAL_RANK: "HOROVOD_LOCAL_RANK",
           LOCAL_SIZE: "HOROVOD_LOCAL_SIZE", CROSS_RANK: "HOROVOD_CROSS_RANK",
           CROSS_SIZE: "HOROVOD_CROSS_SIZE", HOSTNAME: "HOROVOD_HOSTNAME"}
HOROVOD_ELASTIC = "HOROVOD_ELASTIC"
# torchrun's names for the same facts (torchrun's one role has every rank; a group is a host)
TORCH = {"RANK": RANK, "WORLD_SIZE": SIZE, "LOCAL_RANK": LOCAL_RANK, "LOCAL_WORLD_SIZE": LOCAL_SIZE,
         "ROLE_RANK": RANK, "ROLE_WORLD_SIZE": SIZE, "GROUP_RANK": CROSS_RANK, "GROUP_WORLD_SIZE": CROSS_SIZE}
# The rest of what torchrun gives its workers (hvdlite/driver/torchrunenv.py sets them)
TORCHRUN = ("MASTER_ADDR", "MASTER_PORT", "ROLE_NAME", "TORCHELASTIC_RESTART_COUNT",
            "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE")

# Who a worker is and where its driver listens: never inherited from an enclosing job.
IDENTITY = (RANK, SIZE, LOCAL_RANK, LOCAL_SIZE, CROSS_RANK, CROSS_SIZE, HOSTNAME, RENDEZVOUS_ADDR,
            RENDEZVOUS_PORT, SECRET, CLAIM, ROUND, SLOT, WORKER, ELASTIC, HOROVOD_ELASTIC,
            CHECKPOINT_DIR, CHECKPOINT_INTERVAL, CHECKPOINT_KEEP, CHECKPOINT_LINEAGE, TIMELINE, DRIVER_GRACE,
            DRIVER_EPOCH, *HOROVOD.values(),
            *TORCH, *TORCHRUN)
