"""A Slurm allocation as a host source: the hosts and slots at start from the job's environment,
afterwards the live node list from `scontrol show job`, which shrinks when a node fails under
`--no-kill` (an allocation never grows back)."""
import os
import re
import shlex
import subprocess

from hvdlite.discovery.hostlist import SlurmFormatError, expand, tasks_per_node
from hvdlite.discovery.script import DiscoveryError

SCONTROL_TIMEOUT = 10.0  # seconds; slurmctld answers in milliseconds, a hung one must not stall us


class Allocation:
    """The job this process runs in: `job_id` and `hosts` [(host, tasks)] as granted."""

    def __init__(self, job_id: str, hosts):
        self.job_id, self.hosts = job_id, list(hosts)
        self.slots = dict(self.hosts)

    @property
    def tasks(self) -> int:
        return sum(self.slots.values())

    def describe(self) -> str:
        return f"Slurm allocation {self.job_id} ({len(self.hosts)} nodes, {self.tasks} tasks)"


def allocation(env=None):
    """The allocation when this process runs in one and not inside one of its steps (srun),
    else None. SlurmFormatError when the job's variables cannot be read."""
    env = os.environ if env is None else env
    job_id = env.get("SLURM_JOB_ID")
    if not job_id or env.get("SLURM_STEP_ID") is not None:
        return None
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    tasks = env.get("SLURM_TASKS_PER_NODE")
    if not nodelist or not tasks:
        missing = "SLURM_JOB_NODELIST" if not nodelist else "SLURM_TASKS_PER_NODE"
        raise SlurmFormatError(f"SLURM_JOB_ID={job_id} is set but {missing} is not")
    nodes, counts = expand(nodelist), tasks_per_node(tasks)
    if len(nodes) != len(counts):
        raise SlurmFormatError(f"SLURM_TASKS_PER_NODE={tasks!r} counts {len(counts)} nodes, "
                               f"SLURM_JOB_NODELIST={nodelist!r} names {len(nodes)}")
    return Allocation(job_id, [(h, n) for h, n in zip(nodes, counts) if n > 0])


def _scontrol(args, env=None):
    try:
        proc = subprocess.run(["scontrol", *args], capture_output=True, text=True, env=env,
                              timeout=SCONTROL_TIMEOUT, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise DiscoveryError("scontrol not found on PATH") from None
    except subprocess.TimeoutExpired:
        raise DiscoveryError(f"scontrol {args[0]} {args[1]} did not answer within "
                             f"{SCONTROL_TIMEOUT:g} s") from None
    if proc.returncode != 0:
        why = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
        raise DiscoveryError(f"scontrol {' '.join(args)}: {why[:200]}")
    return proc.stdout


def _field(record: str, name: str):
    m = re.search(rf"(?:^|\s){name}=(\S*)", record)
    return m.group(1) if m else None


def live_nodes(job_id: str, env=None) -> list:
    """The job's current nodes (`scontrol show job -o`): DiscoveryError once it is not running."""
    record = _scontrol(["show", "job", "-o", job_id], env)
    state, nodelist = _field(record, "JobState"), _field(record, "NodeList")
    if state != "RUNNING":
        raise DiscoveryError(f"Slurm job {job_id} is {state or 'unknown to scontrol'}")
    if not nodelist or nodelist == "(null)":
        return []
    return expand(nodelist)


def node_address(host: str, env=None) -> str:
    """The address Slurm reaches the node at (NodeAddr): a node's name may resolve only on the
    compute nodes, not where the driver runs."""
    return _field(_scontrol(["show", "node", "-o", host], env), "NodeAddr") or host


class SlurmHosts:
    """Host source: the allocation's nodes with the tasks granted at start. `live`: polled
    from scontrol (elastic jobs), so that nodes that left the allocation leave the job."""

    def __init__(self, alloc: Allocation, live: bool, launcher: str = "srun", env=None):
        self.alloc, self.changes, self.launcher, self.env = alloc, live, launcher, env

    def read(self):
        if not self.changes:
            return self.alloc.hosts
        return [(h, self.alloc.slots[h]) for h in live_nodes(self.alloc.job_id, self.env)
                if h in self.alloc.slots]

    def describe(self) -> str:
        how = "srun steps" if self.launcher == "srun" else f"the {self.launcher} launcher"
        line = f"{self.alloc.describe()}: hosts from the allocation, workers started as {how}"
        if self.changes and kill_on_node_fail(self.alloc.job_id, self.env):
            line += (f"\nwarning: job {self.alloc.job_id} shows no --no-kill: one node's failure "
                     "cancels the whole allocation (add `#SBATCH --no-kill`)")
        return line


def kill_on_node_fail(job_id: str, env=None) -> bool:
    """False when the job is known to run with --no-kill. Slurm 22.05 shows this setting in no
    client command (scontrol show job prints the same with and without it), so the signs read
    are the ones a job can see: SBATCH_NO_KILL/SALLOC_NO_KILL in its environment (sbatch and
    salloc export the submitter's), and `#SBATCH --no-kill` / `-k` in its batch script."""
    env = os.environ if env is None else env
    if any(env.get(name, "off").lower() != "off" for name in ("SBATCH_NO_KILL", "SALLOC_NO_KILL")):
        return False  # set, to anything but "off" (salloc refuses most values: "" or "set")
    try:
        script = _scontrol(["write", "batch_script", job_id, "-"], env)
    except DiscoveryError:  # not a batch job (salloc), or scontrol unavailable
        return True
    return not _directs_no_kill(script)


def _directs_no_kill(script: str) -> bool:
    """Whether the #SBATCH lines (read up to the first command, as sbatch does) ask for it."""
    lines = script.splitlines()
    for line in lines[1:] if lines and lines[0].startswith("#!") else lines:
        line = line.strip()
        if not line:
            continue
        if not line.startswith("#"):
            break
        if line.startswith("#SBATCH"):
            try:
                words = shlex.split(line[len("#SBATCH"):], comments=True)
            except ValueError:
                continue
            if any(w in ("-k", "--no-kill") or w.startswith("--no-kill=") and w != "--no-kill=off"
                   for w in words):
                return True
    return False
