"""`hvdlite run`: command-line flags -> Settings -> driver."""
import argparse
import math
import os
import shutil
import sys
import textwrap

from hvdlite import __version__, defaults, exitcodes, timeouts
from hvdlite.template import DEFAULT_PRELOAD
from hvdlite.worker import backends, checkpointdir
from hvdlite.discovery.hostspec import parse_hostfile, parse_hosts
from hvdlite.discovery.slurm import allocation
from hvdlite.driver.settings import Settings
from hvdlite.driver.store import choice as store_choice
from hvdlite.errors import HvdliteError, UsageError
from hvdlite.jobcommands import discovery_command, training_command


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(message)


def _positive(kind, zero=False):
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
        if value < 0 or value == 0 and not zero:
            raise argparse.ArgumentTypeError(f"must be {'non-negative' if zero else 'positive'}, got {text}")
        return value
    return parse


def _non_negative_int(text):
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}")
    return int(text)


def _port(text):
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise argparse.ArgumentTypeError(f"expected a port number 1-65535, got {text!r}")
    return int(text)


def _seconds(default, what):
    return dict(type=_positive(float), default=default, metavar="SECONDS", help=f"{what} (default {default:g})")


def _scaled(field, what):
    """A timeout whose default is timeouts.SCALED's times --timeout-scale (filled in by parse_settings)."""
    base = timeouts.SCALED[field][1]
    return dict(type=_positive(float), dest=field, metavar="SECONDS",
                help=f"{what} (default {base:g} x --timeout-scale)")


EXAMPLES = """examples:
  # 4 workers on this machine; then 2 SSH hosts with 2 workers each
  hvdlite run -np 4 python3 train.py
  hvdlite run -np 4 -H host1:2,host2:2 python3 train.py
  # elastic: 1 to 4 workers on the hosts ./discover.sh prints (host:slots per line)
  hvdlite run -np 2 --min-np 1 --max-np 4 --host-discovery-script ./discover.sh python3 train.py
  # commits on disk: after a crash, the same command resumes
  hvdlite run -np 4 --min-np 2 --checkpoint-dir ckpt python3 train.py
  # draw the job afterwards
  hvdlite run -np 2 --event-log events.jsonl python3 train.py
  hvdlite timeline events.jsonl -o timeline.html

Docs: docs/ (mkdocs)."""


def exit_code_help() -> str:
    """exitcodes.TABLE as the help's last section (docs/signals.md#exit-codes shows the same)."""
    lines = ["exit codes (docs/signals.md#exit-codes):"]
    for code, who, meaning in exitcodes.TABLE:
        lines += textwrap.wrap(meaning, 96, initial_indent=f"  {who:<7}{code:<7}", subsequent_indent=" " * 16,
                               break_on_hyphens=False)
    return "\n".join(lines)

# The help's groups, in the order shown; a flag joins one with `g[NAME].add_argument(...)`.
GROUPS = {
    "hosts": None,
    "elastic": "on with --min-np or --host-discovery-script",
    "remote hosts": None,
    "ray": "hosts are the nodes of a Ray cluster; workers start in its actors",
    "durable commits": None,
    "watching": None,
    "start-up": None,
    "advanced": None,
}


def build_parser() -> argparse.ArgumentParser:
    # allow_abbrev=False: `--elastic 5` must not pass for --elastic-timeout 5.
    p = _Parser(prog="hvdlite run", usage="hvdlite run [FLAGS] COMMAND [ARGS...]", allow_abbrev=False,
                description="Launch a data-parallel training job: COMMAND runs once per worker.",
                epilog=EXAMPLES + "\n\n" + exit_code_help(), formatter_class=argparse.RawDescriptionHelpFormatter)
    g = {name: p.add_argument_group(name, what) for name, what in GROUPS.items()}
    g["hosts"].add_argument("-np", "--num-proc", type=_positive(int), dest="num_proc", metavar="N",
                            help="number of worker processes (default: all slots)")
    hosts = g["hosts"].add_mutually_exclusive_group()
    hosts.add_argument("-H", "--hosts", metavar="HOSTS", help="hosts and slots, e.g. h1:2,h2:4 (default localhost:NP)")
    hosts.add_argument("--hostfile", metavar="FILE", help="file of 'host slots=N' or 'host:N' lines; '#' starts a comment")

    e = g["elastic"]
    e.add_argument("--min-np", "--min-num-proc", type=_positive(int), dest="min_np", metavar="N",
                   help="fewest workers to train with (default -np)")
    e.add_argument("--max-np", "--max-num-proc", type=_positive(int), dest="max_np", metavar="N",
                   help="most workers to train with (default: all slots)")
    e.add_argument("--host-discovery-script", dest="discovery_script", metavar="COMMAND",
                   help="command printing the current hosts, 'host:slots' per line (a .py file "
                        "runs with this Python)")
    e.add_argument("--slots-per-host", "--slots", type=_positive(int), dest="slots_per_host",
                   metavar="N", help="slots of a discovered host listed without ':slots'")
    e.add_argument("--discovery-interval", **_seconds(defaults.DISCOVERY_INTERVAL,
                                                      "seconds between runs of the discovery script"))
    e.add_argument("--discovery-timeout", **_scaled(
        "discovery_timeout", "seconds before a discovery run is killed and counted as failed"))
    e.add_argument("--reset-limit", type=_non_negative_int, metavar="N",
                   help="fail the job when the world would re-form more often than this")
    e.add_argument("--blacklist", choices=["auto", "host", "slot"], default=defaults.BLACKLIST,
                   help="what a failed worker takes out: its host (Horovod's rule), its slot, or "
                        "auto: the slot when the job runs on one host, else the host (default auto)")
    e.add_argument("--blacklist-cooldown-range", nargs=2, type=_positive(float), metavar=("MIN", "MAX"),
                   dest="cooldown_range",
                   help="seconds a failed host or slot sits out (grows per failure); default: forever")
    e.add_argument("--elastic-timeout", **_scaled("elastic_timeout",
                                                  "seconds to wait for --min-np workers before failing"))
    e.add_argument("--fail-on-worker-failure", action="store_true", default=None,
                   help="exit 1, not 0, when the job finished but a worker failed on the way (for "
                        "CI; default $HVDLITE_FAIL_ON_WORKER_FAILURE, else off: an elastic job "
                        "succeeds when its workers finish, as Horovod's does)")

    r = g["remote hosts"]
    r.add_argument("-p", "--ssh-port", type=_positive(int), metavar="PORT", help="SSH port of remote hosts")
    r.add_argument("-i", "--ssh-identity-file", metavar="FILE", help="SSH private key for remote hosts")
    r.add_argument("--ssh-accept-unknown-hosts", action="store_true",
                   help="accept SSH host keys missing from known_hosts (default: reject them)")
    r.add_argument("--ssh-config", metavar="FILE", help="OpenSSH client config to read (default ~/.ssh/config)")
    r.add_argument("--network-interfaces", "--network-interface", dest="network_interfaces", metavar="IFACES",
                   help="serve the rendezvous on the first of these interfaces (comma list) "
                        "that has an IPv4 address")
    r.add_argument("--rendezvous-addr", dest="bind_address", metavar="ADDR",
                   help="serve the rendezvous on this address (default: loopback for a job on "
                        "this machine only, else every interface)")
    r.add_argument("--launcher", choices=["ssh", "srun", "local"],
                   help="how workers start: over SSH, as Slurm job steps (srun), or on this machine "
                        "(default: srun inside a Slurm allocation without -H, --hostfile or "
                        "--host-discovery-script, else local for this machine and SSH for others)")

    c = g["durable commits"]
    c.add_argument("--checkpoint-dir", metavar="DIR",
                   help="rank 0 writes the newest commit here in the background; the same "
                        "command with the same DIR resumes from the newest one")
    c.add_argument("--checkpoint-interval", type=_positive(float, zero=True), metavar="SECONDS",
                   default=defaults.CHECKPOINT_INTERVAL,
                   help=f"at most one checkpoint write per SECONDS, the newest commit winning; 0: "
                        f"every commit (default {defaults.CHECKPOINT_INTERVAL:g})")
    c.add_argument("--checkpoint-keep", type=_positive(int), metavar="K", default=defaults.CHECKPOINT_KEEP,
                   help=f"newest checkpoints of this training (its lineage) kept in DIR; older "
                        f"ones of it are deleted, other lineages' files are never touched (default "
                        f"{defaults.CHECKPOINT_KEEP})")
    c.add_argument("--driver-store", metavar="URL", type=store_choice.check,
                   help="where the job's drivers keep their lease and journal: etcd://HOST[:PORT],"
                        "...[/PREFIX] for an etcd cluster, etcds:// over TLS with etcdctl's "
                        "ETCDCTL_CACERT, _CERT, _KEY, _USER and _PASSWORD (default: a folder in "
                        "DIR; docs/standby.md)")
    c.add_argument("--standby", action="store_true",
                   help="wait as a standby driver: take the job over when its driver's lease "
                        "lapses (its process or host lost); needs DIR (docs/standby.md)")
    c.add_argument("--fresh", action="store_true",
                   help="start training anew instead of resuming from DIR; DIR's files are kept, "
                        "and later runs resume this one")

    w = g["watching"]
    w.add_argument("--output-filename", dest="output_dir", metavar="DIR",
                   help="also write each worker's output to DIR/rank.N/stdout|stderr; in elastic "
                        "jobs DIR/slot.HOST.I/ (a worker's rank changes, its slot does not)")
    w.add_argument("--event-log", metavar="FILE", help="append the driver's events to FILE as JSON "
                                                       "lines (`hvdlite timeline FILE` draws them)")
    w.add_argument("--metrics-port", type=_port, metavar="PORT",
                   help="serve Prometheus metrics at http://ADDR:PORT/metrics while the job runs")
    w.add_argument("--metrics-addr", metavar="ADDR",
                   help="address the metrics are served on (default: where the rendezvous is served)")
    w.add_argument("--straggler-factor", type=_positive(float), default=defaults.STRAGGLER_FACTOR,
                   metavar="X", help="a rank whose own work per collective is X times the others' "
                                     f"median is named a straggler (default {defaults.STRAGGLER_FACTOR:g}; "
                                     "docs/watching.md#stragglers)")
    w.add_argument("--straggler-policy", choices=["warn", "evict"], default="warn",
                   help="warn: name stragglers; evict (elastic jobs): a straggler for 3 windows "
                        "in a row is failed and blacklisted with the cooldown (default warn)")
    w.add_argument("--timeline-filename", metavar="FILE",
                   help="write every rank's collectives and resets to FILE as a Chrome trace "
                        "(chrome://tracing, Perfetto)")
    w.add_argument("--verbose", action="store_true", help="print what the driver does")
    w.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"],
                   help="INFO prints an elastic job's events, WARNING and above only errors, "
                        "DEBUG also the driver's details")

    s = g["start-up"]
    preload = s.add_mutually_exclusive_group()
    preload.add_argument("--preload", metavar="MODULES",
                         help="comma list of modules a per-host template imports once; every local "
                              "worker forks from it (default: " + ", ".join(DEFAULT_PRELOAD) +
                              ", for workers that join a running job)")
    preload.add_argument("--no-preload", action="store_true", help="start every worker as a fresh process")
    s.add_argument("--keep-warm", type=_positive(float, zero=True), metavar="SECONDS",
                   help="fork this machine's workers from a template kept running after the job "
                        "until SECONDS without a job, so later --keep-warm jobs skip the imports "
                        "(default $HVDLITE_KEEP_WARM or 0: none)")
    s.add_argument("--start-timeout", **_scaled("start_timeout",
                                                "seconds for a worker to start and meet the others; on this machine "
                                                "its wait for a CPU is not counted, up to 10 times that "
                                                "on the wall clock"))

    r = g["ray"]
    r.add_argument("--ray", action="store_true", help="run the job's workers on a Ray cluster")
    r.add_argument("--ray-address", metavar="auto|HOST:PORT",
                   help="the cluster's address (default $RAY_ADDRESS, else auto: the one on this machine)")
    r.add_argument("--cpus-per-slot", type=_positive(float, zero=True), default=1.0, metavar="N",
                   help="CPUs of a Ray node per slot (default 1)")
    r.add_argument("--gpus-per-slot", type=_positive(float, zero=True), default=0.0, metavar="N",
                   help="GPUs of a Ray node per slot (default 0)")
    r.add_argument("--slot-resource", metavar="NAME",
                   help="one slot per unit of this Ray resource, instead of CPUs and GPUs")

    a = g["advanced"]
    a.add_argument("--timeout-scale", type=_positive(float), metavar="X",
                   help="multiply the defaults of --start-timeout, --liveness-timeout, "
                        "--gloo-timeout-seconds, --elastic-timeout, --discovery-timeout and "
                        "--driver-grace by X "
                        f"(default $HVDLITE_TIMEOUT_SCALE or {defaults.TIMEOUT_SCALE:g}); the "
                        "timeouts must keep their order (docs/troubleshooting.md#timeouts)")
    a.add_argument("--gloo-timeout-seconds", **_scaled(
        "collective_timeout", "seconds a collective waits for a peer; longer than --liveness-timeout"))
    a.add_argument("--backend", choices=backends.CHOICES,
                   help="what carries the collectives of CUDA tensors: nccl, gloo (through host "
                        "memory), or auto: nccl where every rank can use it (default "
                        f"${backends.ENV} or {backends.DEFAULT}; docs/gpus.md#backends)")
    a.add_argument("--hang-timeout", type=_positive(float), metavar="SECONDS",
                   help="seconds a rank its peers wait on may make no progress before it is named "
                        "hung, with its stack, and failed (default: 3 x the longest stall the job "
                        f"got past, at least {defaults.HANG_FLOOR:g} x --timeout-scale; "
                        "docs/troubleshooting.md#hangs)")
    a.add_argument("--liveness-timeout", **_scaled(
        "liveness_timeout", "seconds of heartbeat silence after which a worker is killed as "
                            "hung, and a worker that cannot reach the driver exits"))
    a.add_argument("--driver-grace", **_scaled(
        "driver_grace", "with --checkpoint-dir: seconds workers train on without a driver (it died, "
                        "or cannot be reached) for the same command, run again, to take them over; "
                        "then they exit 75 with the newest commit on disk (docs/failover.md)"))
    a.add_argument("--stop-timeout", **_seconds(
        defaults.STOP_TIMEOUT, "seconds a graceful stop (SIGTERM, SIGUSR1 or Ctrl-C to the driver) "
                               "waits for every worker to reach a commit before killing them"))
    p.add_argument("command", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    return p


def parse_settings(argv, notes=None) -> Settings:
    """The job's Settings; a UsageError for bad flags. `notes` (a list) gets the lines to say
    about flags that are right but likely not what was meant."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        raise UsageError("no training command given, e.g. `hvdlite run -np 2 python train.py`")
    stray = flags_after_command(parser, args.command)
    if stray and notes is not None:
        notes.append(f"{', '.join(stray)} after the training command go{'es' if len(stray) == 1 else ''} "
                     f"to the script, not to hvdlite: hvdlite's flags go before COMMAND")
    command = training_command(args.command)
    elastic = bool(args.discovery_script or args.min_np)
    min_np = args.min_np or args.num_proc or 1
    if args.max_np is not None and min_np > args.max_np:
        raise UsageError(f"--min-np/-np {min_np} is larger than --max-np {args.max_np}")
    # -np is where an elastic job starts: it must lie between the bounds.
    if args.num_proc is not None and args.max_np is not None and args.num_proc > args.max_np:
        raise UsageError(f"-np {args.num_proc} is larger than --max-np {args.max_np}")
    if args.num_proc is not None and args.min_np is not None and args.num_proc < args.min_np:
        raise UsageError(f"-np {args.num_proc} is smaller than --min-np {args.min_np}")
    if args.discovery_script and (args.hosts or args.hostfile):
        raise UsageError("use either --host-discovery-script or -H/--hostfile, not both")
    ray_flags(args)
    if args.straggler_policy == "evict" and not elastic:
        raise UsageError("--straggler-policy evict needs an elastic job (--min-np, --max-np or "
                         "--host-discovery-script): a static job cannot go on without a rank")
    if args.straggler_factor <= 1:
        raise UsageError(f"--straggler-factor {args.straggler_factor:g}: must be above 1, or every "
                         f"rank slower than the median is a straggler")
    seconds = timeout_seconds(args)
    if args.cooldown_range and args.cooldown_range[0] > args.cooldown_range[1]:
        raise UsageError("--blacklist-cooldown-range: MIN is larger than MAX")
    slurm, launcher = slurm_job(args)
    if slurm is not None:
        hosts = slurm.hosts
    elif args.hosts:
        hosts = parse_hosts(args.hosts)
    elif args.hostfile:
        hosts = parse_hostfile(args.hostfile)
    else:
        hosts = [("localhost", args.num_proc or args.max_np or min_np)]
    slots = sum(n for _, n in hosts)
    num_proc = args.num_proc or slots
    if args.ray:
        num_proc = args.num_proc
    elif not args.discovery_script and max(num_proc if not elastic else min_np, 1) > slots:
        where = f"the {slots} tasks of {slurm.describe()}" if slurm else \
            f"the {slots} slot{'' if slots == 1 else 's'} available"
        raise UsageError(f"-np {num_proc if not elastic else min_np} asks for more processes "
                         f"than {where}")
    for name in ("ssh_identity_file", "hostfile", "ssh_config"):
        path = getattr(args, name)
        if path and not os.path.isfile(path):
            raise UsageError(f"--{name.replace('_', '-')}: no such file {path}")
    if args.checkpoint_dir is not None:
        args.checkpoint_dir = checkpoint_dir(args.checkpoint_dir)
    elif args.fresh:
        raise UsageError("--fresh starts anew instead of resuming from --checkpoint-dir: give one")
    for flag in ("driver_store", "standby"):
        if getattr(args, flag) and (args.checkpoint_dir is None or not elastic):
            raise UsageError(f"--{flag.replace('_', '-')} is for an elastic --checkpoint-dir job "
                             f"(--min-np or --host-discovery-script), whose drivers share its lease")
    fail_on_worker_failure = switch_or_env(args.fail_on_worker_failure, "HVDLITE_FAIL_ON_WORKER_FAILURE")
    if args.keep_warm and args.no_preload:
        raise UsageError("--keep-warm keeps a preloaded template: drop --no-preload")
    # A flag outranks the environment: --no-preload with $HVDLITE_KEEP_WARM set keeps nothing.
    keep_warm = 0.0 if args.no_preload else flag_or_env(args.keep_warm, "HVDLITE_KEEP_WARM", 0.0, zero=True)
    return Settings(
        command=command, num_proc=num_proc, hosts=None if args.discovery_script or args.ray else hosts,
        **seconds,
        output_dir=args.output_dir, verbose=args.verbose, log_level=args.log_level,
        network_interfaces=args.network_interfaces.split(",") if args.network_interfaces else None,
        bind_address=args.bind_address,
        ssh_port=args.ssh_port, ssh_identity_file=args.ssh_identity_file,
        ssh_accept_unknown_hosts=args.ssh_accept_unknown_hosts, ssh_config=args.ssh_config,
        launcher="ray" if args.ray else launcher, slurm=slurm, ray_address=args.ray_address,
        cpus_per_slot=args.cpus_per_slot, gpus_per_slot=args.gpus_per_slot, slot_resource=args.slot_resource,
        event_log=args.event_log, metrics_port=args.metrics_port, metrics_addr=args.metrics_addr,
        straggler_factor=args.straggler_factor, straggler_policy=args.straggler_policy,
        timeline_filename=os.path.abspath(args.timeline_filename) if args.timeline_filename else None,
        elastic=elastic, min_np=min_np, max_np=args.max_np, slots_per_host=args.slots_per_host,
        discovery_script=discovery_command(args.discovery_script) if args.discovery_script else None,
        discovery_interval=args.discovery_interval,
        reset_limit=args.reset_limit, blacklist=args.blacklist,
        cooldown_range=tuple(args.cooldown_range) if args.cooldown_range else None,
        stop_timeout=args.stop_timeout, fail_on_worker_failure=fail_on_worker_failure,
        preload=() if args.no_preload else tuple(_modules(args.preload)) if args.preload else DEFAULT_PRELOAD,
        preload_first=bool(args.preload), keep_warm=keep_warm, checkpoint_dir=args.checkpoint_dir,
        checkpoint_interval=args.checkpoint_interval, checkpoint_keep=args.checkpoint_keep,
        driver_store=args.driver_store, standby=args.standby,
        checkpoint_lineage=checkpointdir.new_lineage() if args.fresh else None, backend=args.backend)


# hvdlite flags a script is as likely to have for its own: never named when they follow COMMAND.
_SCRIPT_FLAGS = {"-h", "--help", "-p", "-i"}


def flags_after_command(parser, command) -> list:
    """hvdlite's own flags among the words after COMMAND (`hvdlite run python3 train.py -np 2`).
    They go to the script, which may have a flag of that name itself: said, not refused."""
    ours = {s for action in parser._actions for s in action.option_strings} - _SCRIPT_FLAGS
    return [word for word in command[1:] if word.split("=", 1)[0] in ours]


def timeout_seconds(args) -> dict:
    """The scaled timeouts (Settings fields -> seconds), refused as a UsageError when out of order."""
    scale = flag_or_env(args.timeout_scale, "HVDLITE_TIMEOUT_SCALE", defaults.TIMEOUT_SCALE)
    given = {field: getattr(args, field) for field in (*timeouts.SCALED, "hang_timeout")
             if getattr(args, field) is not None}
    seconds = timeouts.resolve(given, scale)
    timeouts.check(seconds, given, scale)
    return seconds


def ray_flags(args):
    """--ray takes its hosts from the cluster; the Ray flags mean nothing without it."""
    if not args.ray:
        if args.ray_address or args.slot_resource:
            raise UsageError("--ray-address and --slot-resource need --ray")
        return
    if args.hosts or args.hostfile or args.discovery_script:
        raise UsageError("--ray takes the hosts from the Ray cluster: drop -H/--hostfile/--host-discovery-script")
    if not args.slot_resource and not args.cpus_per_slot and not args.gpus_per_slot:
        raise UsageError("--cpus-per-slot and --gpus-per-slot are both 0: a slot must take something")


def slurm_job(args):
    """(allocation or None, launcher or None). Inside a Slurm allocation a job with no host
    flags runs on the allocation's nodes, as srun steps unless --launcher says otherwise
    (--launcher local: this machine only, as outside)."""
    listed = args.hosts or args.hostfile or args.discovery_script or args.ray
    if (listed or args.launcher == "local") and args.launcher != "srun":
        return None, args.launcher
    try:
        alloc = allocation()
    except HvdliteError as e:
        raise UsageError(str(e)) from None
    launcher = args.launcher or ("srun" if alloc else None)
    if launcher == "srun":
        if alloc is None:
            raise UsageError("--launcher srun: not inside a Slurm allocation (SLURM_JOB_ID is "
                             "unset, or SLURM_STEP_ID is set inside a job step)")
        if shutil.which("srun") is None:
            raise UsageError("srun not found on PATH: workers start as Slurm job steps inside "
                             "an allocation (or pass --launcher ssh)")
    return (None if listed else alloc), launcher


def checkpoint_dir(path: str) -> str:
    """The checkpoint folder as an absolute path (remote workers use the same one), created
    here if missing."""
    path = os.path.abspath(os.path.expanduser(path))
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise UsageError(f"--checkpoint-dir: cannot create {path}: {e.strerror}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise UsageError(f"--checkpoint-dir: {path} is not writable")
    return path


def flag_or_env(flag, variable: str, default: float, zero=False) -> float:
    """The flag's value, else the environment variable's (a positive number, or 0 with `zero`),
    else `default`."""
    if flag is not None:
        return flag
    text = os.environ.get(variable)
    if not text:
        return default
    try:
        return _positive(float, zero=zero)(text)
    except argparse.ArgumentTypeError as e:
        raise UsageError(f"{variable}: {e}") from None


def switch_or_env(flag, variable: str) -> bool:
    """A store_true flag given, else the environment variable's yes (1, true, yes) or no (0,
    false, no, empty); anything else is a usage error rather than a guess."""
    if flag:
        return True
    text = os.environ.get(variable, "").strip().lower()
    if text in ("1", "true", "yes"):
        return True
    if text in ("", "0", "false", "no"):
        return False
    raise UsageError(f"{variable}={text!r}: expected 1 or 0 (true/false, yes/no)")


def _modules(text):
    modules = [m.strip() for m in text.split(",") if m.strip()]
    if not modules:
        raise UsageError("--preload: name at least one module, e.g. --preload torch,numpy")
    return modules


HELP = """usage: hvdlite COMMAND [ARGS...]

Horovod-style elastic distributed training on torch.distributed's gloo.

commands:
  run        launch a training job                     hvdlite run -np 2 python3 train.py
  timeline   draw a job from its --event-log as HTML,  hvdlite timeline events.jsonl -o t.html
             or merge a killed job's trace parts       hvdlite timeline FILE.parts -o FILE

options:
  -h, --help  show this help
  --version   print hvdlite's version

`hvdlite COMMAND --help` describes a command's flags."""


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(HELP, file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    if argv[0] == "--version":
        print(f"hvdlite {__version__}")
        return 0
    if argv[0] == "timeline":
        from hvdlite.timeline.command import main as timeline
        return timeline(argv[1:])
    if argv[0] != "run":
        print(f"hvdlite: error: unknown command {argv[0]!r}: the commands are run and timeline "
              f"(hvdlite --help)", file=sys.stderr)
        return 2
    notes = []
    try:
        settings = parse_settings(argv[1:], notes)
    except HvdliteError as e:
        print(f"hvdlite run: error: {e}", file=sys.stderr)
        return e.exit_code
    for note in notes:
        print(f"hvdlite run: note: {note}", file=sys.stderr)
    from hvdlite.driver.job import run
    return run(settings)


if __name__ == "__main__":
    sys.exit(main())
