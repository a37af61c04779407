"""Bitwise recovery, measured: randomized faults against a fault-free run of the same job.

    python bench/determinism.py [--runs 5] [--kinds kill stop term graceful ssh-cut slurm-kill resize]
                                [--seed 0] [--quick]
    python bench/determinism.py --digits [--faults 20] [--plot docs/determinism.png]
    python bench/determinism.py --styles [before after ...] [--kinds kill stop term graceful] [--runs 1]

The job is tests/scripts/determinism_job.py (dropout, SGD momentum, a DataLoader with worker
processes over an ElasticSampler, Horovod's API only), two ranks and a spare slot on this
machine. One fault-free run first; then, per fault kind, --runs runs with faults at random
steps on random ranks:
- kill: kill -9 of a worker; the spare slot takes its place (same world size);
- stop: SIGSTOP of a worker until the driver evicts it (--liveness-timeout), then the spare;
- term: SIGTERM to a worker, which leaves at its next commit; the spare replaces it;
- graceful: SIGTERM to the driver (exit 75 at a commit, --checkpoint-dir), then the same
  command again, which resumes from the folder;
- ssh-cut: the job on three sshd test hosts in network namespaces (tests/sshhosts.py), a
  worker's host cut off (every packet dropped, no FIN); the third host takes its place. Once
  the world re-formed, the stranded worker is killed and the host healed (it rebooted);
- slurm-kill: the job in `salloc -N3 --no-kill` on the Slurm test cluster
  (tests/slurmcluster.py), every process of a worker's node killed, slurmd too; the third
  node takes its place; the node is started again after the run;
- resize: the hosts shrink and grow mid-epoch (discovery), kills on top: the world size
  changes, so only "every sample exactly once each epoch" is promised, not equal bytes.
ssh-cut and slurm-kill need root and the clusters' tools: without them they are skipped with
the reason. Every run is compared with the one fault-free run on this machine: where the ranks
run does not change the bytes (ranks stay put, gloo sums in rank order).
Prints per kind (--runs runs of each of --kinds): runs equal / differing to the fault-free
run (same size), and epochs exactly-once / not. --quick: one run of kill, term and resize with two epochs (CI).

--styles runs that for each way of writing the loop (STYLES: the job's STYLE) and prints the
matrix of styles by fault kinds, each cell the runs equal to that style's fault-free run.

--digits trains on scikit-learn's 8x8 digits (bundled, no download) with --faults faults of
mixed kinds against the same run with none, and a resized run with faults, and draws the
three loss curves with the faults marked (matplotlib) into --plot.
"""
import argparse
import json
import os
import random
import signal
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
from jobs import SCRIPTS, Job, progress, ssh_flags  # noqa: E402 - tests/, after the path
import slurmcluster  # noqa: E402
import sshhosts  # noqa: E402

ROOT = os.path.dirname(HERE)
JOB = [sys.executable, os.path.join(SCRIPTS, "determinism_job.py")]
FIXED = ["-np", "2", "--min-np", "2", "--max-np", "2", "--liveness-timeout", "3",
         "--blacklist-cooldown-range", "1", "2"]
SAME_SIZE = ["-H", "localhost:3", *FIXED]
SAME_SIZE_KINDS = ["kill", "stop", "term", "graceful"]
CLUSTER_KINDS = ["ssh-cut", "slurm-kill"]
STEP_TIMEOUT = 120  # seconds a job may take to reach a fault's step or to finish
# Ways to write the loop: the job's STYLE (scripts/determinism_job.py) for each
STYLES = {"before": "", "after": "after", "accumulate": "accumulate", "scaler": "scaler,after",
          "scheduler": "scheduler", "two-optimizers": "two-optimizers,after", "generators": "generators",
          "ddp": "ddp,accumulate", "all": "after,accumulate,scaler,scheduler,two-optimizers,generators"}


class Clusters:
    """The SSH test hosts and the Slurm test cluster, started on first use; the nodes a run
    killed are started again after it."""

    def __init__(self):
        self.hosts = self.slurm = None
        self.killed = []

    def unavailable(self, kind):
        """Why `kind` cannot run here, or None."""
        if kind == "ssh-cut":
            reason = sshhosts.missing_tools() or (None if os.geteuid() == 0 else "not root")
            if reason is None and self.ssh().mode != "netns":
                reason = f"no network namespaces: {self.hosts.fallback_reason}"
            return reason
        return slurmcluster.missing() if kind == "slurm-kill" else None

    def ssh(self):
        if self.hosts is None:
            self.hosts = sshhosts.TestHosts(3)
        return self.hosts

    def cluster(self):
        if self.slurm is None:
            self.slurm = slurmcluster.SlurmCluster(3, slurmd_timeout=10)
        return self.slurm

    def launch(self, kind):
        """(driver flags, the command the driver runs in, its environment) of a same-size run."""
        if kind == "ssh-cut":
            return [*ssh_flags(self.ssh()), "-H", "host-1:1,host-2:1,host-3:1", *FIXED], (), {"PYTHONPATH": ROOT}
        if kind == "slurm-kill":
            env = {"PYTHONPATH": ROOT, "SLURM_CONF": self.cluster().conf, "SALLOC_NO_KILL": ""}
            return FIXED, ("salloc", "-N3", "--no-kill"), env
        return SAME_SIZE, (), {}

    def cut(self, job, slot):
        """Cut the slot's host off until the world re-formed without it; then the host reboots."""
        host = slot.rsplit("/", 1)[0]
        self.hosts.partition(host)
        try:
            wait_gone(job, slot)
        finally:
            for pid, _, args in self.hosts.processes(host):
                if "determinism_job.py" in args:
                    self.hosts.run(host, ["kill", "-9", str(pid)])
            self.hosts.heal(host)

    def kill_node(self, slot):
        node = slot.rsplit("/", 1)[0]
        self.slurm.kill_node(node)
        self.killed.append(node)

    def restart(self):
        """The nodes killed by the last run, once its allocation is over."""
        while self.killed:
            self.slurm.start_node(self.killed.pop())

    def close(self):
        for group in (self.hosts, self.slurm):
            if group is not None:
                group.close()


def members(job):
    formed = rounds(job)
    return formed[-1]["members"] if formed else {}


def pid_of(job, slot):
    return [e["pid"] for e in job.events() if e["event"] == "worker_start" and e["slot"] == slot][-1]


def rounds(job):
    return [e for e in job.events() if e["event"] == "round_complete"]


def wait_gone(job, slot):
    """Until a world formed without `slot` (or the job ended)."""
    job.wait_for(lambda _: slot not in members(job) or job.proc.poll() is not None, STEP_TIMEOUT)


def recovered(job, log_dir, before, step):
    """A world formed after the fault and has trained beyond `step`."""
    return len(rounds(job)) > before and progress(log_dir) > step


def inject(job, kind, rng, clusters):
    """One fault; returns False when the job stopped (graceful) and must be run again."""
    if kind == "graceful":
        job.proc.send_signal(signal.SIGTERM)
        return False
    if len(members(job)) < 2:
        return True  # the last worker holds the only copy of the state: killing it loses the job
    slot = rng.choice(sorted(members(job)))
    if kind == "ssh-cut":
        clusters.cut(job, slot)
        return True
    if kind == "slurm-kill":
        clusters.kill_node(slot)
        return True
    pid = pid_of(job, slot)
    os.kill(pid, {"kill": signal.SIGKILL, "stop": signal.SIGSTOP, "term": signal.SIGTERM}[kind])
    if kind == "stop":  # until the world re-formed without it; then it may go
        wait_gone(job, slot)
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
    return True


def run(log_dir, args, env, plan, rng, clusters=None, prefix=()):
    """Run the job (again after each graceful stop) with `plan`'s faults, (step, kind) each,
    the driver under `prefix` (salloc); returns (final.json, [(step, kind) injected])."""
    os.makedirs(log_dir, exist_ok=True)
    plan, injected, attempt = list(plan), [], 0
    while True:
        attempt += 1
        folder = os.path.join(log_dir, f"run{attempt}")
        os.makedirs(folder)
        with Job([*args, *JOB], folder, {"LOG_DIR": log_dir, **env}, prefix=prefix) as job:
            stopped = False
            while plan and not stopped:
                step, kind = plan.pop(0)
                job.wait_for(lambda _: progress(log_dir) >= step or job.proc.poll() is not None, STEP_TIMEOUT)
                if job.proc.poll() is not None:
                    break
                before, at = len(rounds(job)), progress(log_dir)
                injected.append((at, kind))
                stopped = not inject(job, kind, rng, clusters)
                if not stopped:
                    job.wait_for(lambda _: recovered(job, log_dir, before, at) or job.proc.poll() is not None,
                                 STEP_TIMEOUT)
            result = job.finish(STEP_TIMEOUT)
        if result.code == 75 and stopped:
            continue
        if result.code != 0:
            raise SystemExit(f"the job in {folder} failed ({result.code}):\n{result.stderr[-2000:]}")
        with open(os.path.join(log_dir, "final.json")) as f:
            return json.load(f), injected


def losses(log_dir):
    """Each step's loss as last committed (a rolled-back step's record is replaced)."""
    by_step = {}
    with open(os.path.join(log_dir, "losses.jsonl")) as f:
        for line in f:
            record = json.loads(line)
            by_step[record["step"]] = record
    return [by_step[s] for s in sorted(by_step)]


def resize_flags(log_dir, rng, total, sizes=(1, 3, 2)):
    """Discovery that takes the job from two slots through `sizes` at random steps."""
    steps = sorted(rng.sample(range(3, total - 3), len(sizes)))
    schedule = [[0, ["localhost:2"]], *([step, [f"localhost:{size}"]] for step, size in zip(steps, sizes))]
    path = os.path.join(log_dir, "schedule.json")
    os.makedirs(log_dir, exist_ok=True)
    with open(path, "w") as f:
        json.dump(schedule, f)
    return ["--host-discovery-script", f"{sys.executable} {SCRIPTS}/discover.py {path} {log_dir}/progress",
            "--min-np", "1", "--liveness-timeout", "3", "--blacklist-cooldown-range", "1", "2"]


def steps_of(env):
    """Training steps of a fault-free two-rank run (for placing faults)."""
    epochs, batch = int(env["EPOCHS"]), int(env.get("BATCH", "4"))
    samples = 1797 if env.get("DATA") == "digits" else 96
    return epochs * -(-samples // (2 * batch))


def trials(args, root, env):
    rng = random.Random(args.seed)
    reference, _ = run(os.path.join(root, "reference"), SAME_SIZE, env, [], rng)
    total = steps_of(env)
    table, skipped, clusters = {}, {}, Clusters()
    try:
        for kind in args.kinds:
            skipped[kind] = clusters.unavailable(kind)
            if skipped[kind]:
                print(f"  {kind}: skipped, {skipped[kind]}", flush=True)
                continue
            table[kind] = [0, 0, 0, 0]  # runs equal, differing, epochs exactly-once, not
            for n in range(args.runs):
                table[kind] = [a + b for a, b in zip(table[kind], trial(args, root, env, kind, n, rng, clusters,
                                                                          reference, total))]
    finally:
        clusters.close()
    print(f"\n{'fault':10} {'runs equal':>11} {'differing':>10} {'epochs exactly-once':>20} {'not':>5}")
    for kind, (equal, differing, once, not_once) in table.items():
        same = "-" if kind == "resize" else equal
        print(f"{kind:10} {same:>11} {'-' if kind == 'resize' else differing:>10} {once:>20} {not_once:>5}")
    for kind, reason in skipped.items():
        if reason:
            print(f"{kind:10} skipped: {reason}")
    return all(t[1] == 0 and t[3] == 0 for t in table.values()), table


def matrix(args, root, env):
    """trials() for each of --styles; prints styles by kinds, each cell `equal/runs`."""
    cells, ok = {}, True
    for style in args.styles:
        print(f"style {style} (STYLE={STYLES[style]!r})", flush=True)
        passed, cells[style] = trials(args, os.path.join(root, style), {**env, "STYLE": STYLES[style]})
        ok = ok and passed
    kinds = [k for k in args.kinds if k != "resize"]
    print(f"\n{'style':15}" + "".join(f"{kind:>12}" for kind in kinds))
    for style, table in cells.items():
        print(f"{style:15}" + "".join(f"{f'{table[k][0]}/{table[k][0] + table[k][1]}' if k in table else '-':>12}"
                                      for k in kinds))
    return ok


def trial(args, root, env, kind, n, rng, clusters, reference, total):
    """Run n of `kind`: (equal, differing, epochs exactly-once, epochs not)."""
    log_dir = os.path.join(root, f"{kind}{n}")
    prefix, extra = (), {}
    if kind == "resize":
        flags, plan = resize_flags(log_dir, rng, total), [(rng.randrange(3, total - 3), "kill")]
    else:
        (flags, prefix, extra), plan = clusters.launch(kind), [(rng.randrange(3, total - 3), kind)]
    if kind == "graceful":
        flags = [*flags, "--checkpoint-dir", os.path.join(log_dir, "ckpt")]
    try:
        final, injected = run(log_dir, flags, {**env, **extra}, plan, rng, clusters, prefix)
    finally:
        if kind == "slurm-kill":
            clusters.restart()
    once = sum(final["epochs"])
    same = final["hash"] == reference["hash"]
    print(f"  {kind} run {n}: faults at {injected}: "
          + ("" if kind == "resize" else "equal, " if same else "DIFFERENT, ")
          + f"epochs exactly-once {once}/{len(final['epochs'])}", flush=True)
    compared = kind != "resize"
    return compared and same, compared and not same, once, len(final["epochs"]) - once


def digits(args, root):
    env = {"DATA": "digits", "EPOCHS": "4", "BATCH": "16", "STEP_SLEEP": "0.03", "WORKERS": "1"}
    rng = random.Random(args.seed)
    total = steps_of(env)
    run(os.path.join(root, "none"), SAME_SIZE, env, [], rng)
    steps = sorted(rng.sample(range(5, total - 5), args.faults))
    plan = [(s, rng.choice(SAME_SIZE_KINDS)) for s in steps]
    ckpt = ["--checkpoint-dir", os.path.join(root, "faults", "ckpt")]
    _, plan = run(os.path.join(root, "faults"), [*SAME_SIZE, *ckpt], env, plan, rng)  # as injected
    resized_dir = os.path.join(root, "resized")
    flags = resize_flags(resized_dir, rng, total, sizes=(1, 2, 1, 2))
    run(resized_dir, flags, env, [(s, "kill") for s in sorted(rng.sample(range(5, total - 5), 4))], rng)
    curves = {name: losses(os.path.join(root, name)) for name in ("none", "faults", "resized")}
    finals = {}
    for name in curves:
        with open(os.path.join(root, name, "final.json")) as f:
            finals[name] = json.load(f)
    same = [a["loss"] for a in curves["none"]] == [b["loss"] for b in curves["faults"]]
    for name, final in finals.items():
        print(f"{name:8} accuracy {final['accuracy']:.4f} hash {final['hash'][:16]} "
              f"epochs exactly-once {sum(final['epochs'])}/{len(final['epochs'])}")
    print(f"loss curve with {len(plan)} faults at 2 ranks equal bit for bit to the fault-free one: {same}")
    plot(args.plot, curves, plan, finals)
    return same and finals["none"]["hash"] == finals["faults"]["hash"]


def plot(path, curves, plan, finals):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 3.6), dpi=90)
    styles = {"none": ("no fault", "-", 2.5), "faults": (f"{len(plan)} faults, 2 ranks", "--", 1.2),
              "resized": ("resized 2→1→2→1→2, kills", ":", 1.2)}
    for name, records in curves.items():
        label, style, width = styles[name]
        ax.plot([r["step"] for r in records], [r["loss"] for r in records], style, linewidth=width,
                label=f"{label} (accuracy {finals[name]['accuracy']:.3f})")
    markers = {"kill": "x", "stop": "s", "term": "v", "graceful": "o"}
    for kind, marker in markers.items():
        steps = [s for s, k in plan if k == kind]
        if steps:
            ax.scatter(steps, [0.02] * len(steps), marker=marker, color="black", s=18, label=f"fault: {kind}",
                       transform=ax.get_xaxis_transform())
    ax.set_xlabel("training step")
    ax.set_ylabel("loss (mean of the ranks)")
    ax.set_yscale("log")
    ax.set_title("8x8 digits: a run with faults against one without")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path)
    print(f"wrote {path} ({os.path.getsize(path) // 1024} KB)")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=5, help="runs per fault kind")
    kinds = [*SAME_SIZE_KINDS, *CLUSTER_KINDS, "resize"]
    p.add_argument("--kinds", nargs="+", default=kinds, choices=kinds)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="one run of kill, term and resize, two epochs (CI)")
    p.add_argument("--digits", action="store_true", help="the digits run and its plot")
    p.add_argument("--styles", nargs="*", choices=list(STYLES),
                   help="the matrix: these ways of writing the loop (none named: all) by --kinds")
    p.add_argument("--faults", type=int, default=20)
    p.add_argument("--plot", default=os.path.join(HERE, "..", "docs", "determinism.png"))
    p.add_argument("--dir", default=None, help="where the runs write (default: a new temporary folder)")
    args = p.parse_args()
    if args.styles is not None:
        args.styles = args.styles or list(STYLES)
        if "--kinds" not in sys.argv:
            args.kinds = SAME_SIZE_KINDS
    import tempfile
    root = args.dir or tempfile.mkdtemp(prefix="hvdlite-determinism-")
    start = time.monotonic()
    if args.digits:
        ok = digits(args, root)
    else:
        if args.quick:
            args.runs, args.kinds, args.epochs = 1, ["kill", "term", "resize"], 2
        env = {"EPOCHS": str(args.epochs), "STEP_SLEEP": "0.02"}
        ok = matrix(args, root, env) if args.styles else trials(args, root, env)[0]
    print(f"{time.monotonic() - start:.0f} s, runs in {root}")
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
