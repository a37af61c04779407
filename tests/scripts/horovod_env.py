"""An elastic job that records what a Horovod script reads: its environment at launch and its
rank, and keeps its own `commits` counter in the state (a name hvdlite must not take)."""
import json
import os
import time

import hvdlite.torch as hvd

LOG_DIR = os.environ["LOG_DIR"]
STEPS = int(os.environ.get("TOTAL_STEPS", "10"))
SLOT = os.environ["HVDLITE_SLOT"].replace("/", "_")
NAMES = ["HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE",
         "HOROVOD_CROSS_RANK", "HOROVOD_CROSS_SIZE", "HOROVOD_HOSTNAME", "HOROVOD_ELASTIC",
         "HVDLITE_RANK", "HVDLITE_SIZE"]
launch_env = {name: os.environ.get(name) for name in NAMES}
hvd.init()
with open(os.path.join(LOG_DIR, f"env.{SLOT}.json"), "w") as f:
    json.dump({"env": launch_env, "rank": hvd.rank(), "size": hvd.size(),
               "local_rank": hvd.local_rank(), "cross_rank": hvd.cross_rank()}, f)


@hvd.elastic.run
def train(state):
    while state.step < STEPS:
        state.step += 1
        state.commits += 1  # the script's own counter, beside hvdlite's
        state.commit()
        time.sleep(0.02)


state = hvd.elastic.ObjectState(step=0, commits=0)
train(state)
with open(os.path.join(LOG_DIR, f"final.{SLOT}.json"), "w") as f:
    json.dump({"step": state.step, "commits": state.commits}, f)
