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
ROUND = "HVDLITE_ROUND"  # rendezvous round the initial assignment belongs to
SLOT = "HVDLITE_SLOT"  # stable identity of the worker's slot, "host/index"
ELASTIC = "HVDLITE_ELASTIC"
COLLECTIVE_TIMEOUT = "HVDLITE_COLLECTIVE_TIMEOUT"  # seconds
LIVENESS_TIMEOUT = "HVDLITE_LIVENESS_TIMEOUT"  # seconds
ELASTIC_TIMEOUT = "HVDLITE_ELASTIC_TIMEOUT"  # seconds a worker waits for a new world
START_TIMEOUT = "HVDLITE_START_TIMEOUT"  # seconds to form the first world

# Who a worker is and where its driver listens: never inherited from an enclosing job.
IDENTITY = (RANK, SIZE, LOCAL_RANK, LOCAL_SIZE, CROSS_RANK, CROSS_SIZE, HOSTNAME, RENDEZVOUS_ADDR,
            RENDEZVOUS_PORT, SECRET, ROUND, SLOT, ELASTIC,
            "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
