"""Stall hunt: kill random members of a large local elastic job again and again, and catch any
stretch where the job makes no progress.

    python bench/stall.py [--backend numpy|torch] [--ranks 32] [--kills 500] [--stall 5]
                          [--early 0.6] [--seed 0] [--plain] [--keep DIR]

A real job on one host with --ranks slots (bench/scripts/stall_step.py: an allreduce and a commit
per step) and a short cooldown, so a killed slot is relaunched and joins again. Each kill -9 lands
on a member of the world just formed, after a random delay of 0 to --early seconds (while the
world connects or syncs the state) or, every other kill, once the world trains. A stall is
--stall seconds from a kill without a step in a newer world, or --stall seconds in which no worker
completes a step and the driver logs nothing: then every live worker's Python stacks
(faulthandler, SIGUSR2), native stacks (py-spy, if installed; its voucher's too, and the
driver's) and TCP sockets are written to --keep/stall-N/, and the hunt goes on once the job
moves again. After a kill its
length runs from the kill to the first step of a newer world (a world formed without a wedged
survivor is no progress until it steps); otherwise from the last step or event before it to the
first after it; by their own time stamps (a gap under --stall means the hunt itself was starved:
not counted). The job's start is not timed.
Prints the kills, the stalls with their lengths, the workers that failed on their own (not by a
kill), the members the next world formed without (those held in a pygloo collective apart), and
the recovery times (kill -> first step of a newer world) against their median.
"""
import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SCRIPT = os.path.join(HERE, "scripts", "stall_step.py")
PYGLOO = os.path.join(ROOT, ".venv-pygloo", "bin", "python")
RECOVERY_LIMIT = 120.0  # seconds a kill may take to lead to a full world again


class Tail:
    """A file read as it grows, in whole lines."""

    def __init__(self, path):
        self.path, self.offset = path, 0

    def lines(self):
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        data = data[:data.rfind(b"\n") + 1]
        self.offset += len(data)
        return data.decode().splitlines()


class Job:
    def __init__(self, backend, ranks, folder, plain=False):
        self.dir = folder
        python = PYGLOO if backend == "numpy" else sys.executable
        cmd = [sys.executable, "-m", "hvdlite.cli", "run", "-H", f"localhost:{ranks}", "--min-np", "2",
               "--blacklist-cooldown-range", "0.3", "0.3", "--event-log", self.path("events.jsonl"),
               *(["--no-preload"] if plain else []), python, SCRIPT]
        env = {**os.environ, "LOG_DIR": folder, "STALL_BACKEND": backend}
        self.out = open(self.path("driver.out"), "w")
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.out, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        self.events, self.steps = Tail(self.path("events.jsonl")), Tail(self.path("steps"))
        self.pids = {}  # worker id -> pid, of live workers
        self.rounds = []  # round_complete events
        self.failed = []  # worker_exit events of workers that failed on their own (not killed -9)
        self.left_behind = []  # member_left_behind events: worlds formed without a wedged survivor
        self.newest = 0.0  # when the newest step or event happened (its own time stamp)
        self.last_move = time.monotonic()
        self.last_step = None  # (time, round) of the newest step

    def path(self, name):
        return os.path.join(self.dir, name)

    def poll(self):
        """Read what happened; True when anything did."""
        moved = False
        for line in self.events.lines():
            moved = True
            e = json.loads(line)
            self.newest = max(self.newest, e["time"])
            if e["event"] == "worker_start":
                self.pids[e["worker"]] = e["pid"]
            elif e["event"] == "worker_exit":
                self.pids.pop(e["worker"], None)
                if e["code"] not in (0, -signal.SIGKILL):
                    self.failed.append(e)
            elif e["event"] == "round_complete":
                self.rounds.append(e)
            elif e["event"] == "member_left_behind":
                self.left_behind.append(e)
            elif e["event"] == "job_end":
                raise RuntimeError(f"the job ended: {e}")
        for line in self.steps.lines():
            moved = True
            t, _, round_, _, _ = line.split()
            self.last_step = (float(t), int(round_))
            self.newest = max(self.newest, float(t))
        if moved:
            self.last_move = time.monotonic()
        if self.proc.poll() is not None:
            raise RuntimeError(f"the driver exited with {self.proc.returncode}")
        return moved

    def first_after(self, moment):
        """When the first step or event after `moment` happened (by their time stamps)."""
        times = [float(line.split()[0]) for line in open(self.path("steps")) if float(line.split()[0]) > moment]
        times += [e["time"] for e in map(json.loads, open(self.path("events.jsonl"))) if e["time"] > moment]
        return min(times, default=moment)

    def members(self, round_event):
        """Pids of the live members of a round."""
        slots = set(round_event["members"])
        return [pid for worker, pid in self.pids.items() if worker.split("#")[0] in slots]

    def stop(self):
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(30)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        for pid in self.pids.values():  # workers lead their own process groups
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.out.close()


def tcp_table():
    """socket inode -> "local remote state" of every TCP socket of this host."""
    sys.path.insert(0, ROOT)
    from hvdlite.worker.sockets import _address
    found = {}
    for table in ("tcp", "tcp6"):
        try:
            with open(f"/proc/net/{table}") as f:
                for row in [line.split() for line in f.readlines()[1:]]:
                    local, remote = _address(row[1]), _address(row[2])
                    found[int(row[9])] = f"{local[0]}:{local[1]} -> {remote[0]}:{remote[1]} st={row[3]}"
        except OSError:
            pass
    return found


def _fds(pid):
    try:
        return sorted(os.listdir(f"/proc/{pid}/fd"), key=int)
    except OSError:
        return []


def _children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(word) for word in f.read().split()]
    except OSError:
        return []


def dump(job, folder):
    """Every live worker's stacks and sockets, and the driver's last words, into `folder`."""
    os.makedirs(folder, exist_ok=True)
    table = tcp_table()
    workers = sorted(job.pids.items())
    for _, pid in workers:  # Python stacks first, all at once: the state may change soon
        if os.path.exists(job.path(f"stacks.{pid}")):  # its handler is in place
            try:
                os.kill(pid, signal.SIGUSR2)
            except ProcessLookupError:
                pass
    texts = {}
    for worker, pid in workers:  # sockets first, while the state is the stall's
        lines = [f"worker {worker} pid {pid}"]
        for fd in _fds(pid):
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue  # closed meanwhile
            if link.startswith("socket:"):
                lines.append(f"  fd {fd}: {table.get(int(link[8:-1]), link)}")
        for child in _children(pid):  # the voucher (numpy): which of the sockets it holds
            held = []
            for fd in _fds(child):
                try:
                    link = os.readlink(f"/proc/{child}/fd/{fd}")
                except OSError:
                    continue
                if link.startswith("socket:"):
                    held.append(table.get(int(link[8:-1]), link))
            lines.append(f"  child {child} holds: " + "; ".join(held))
        texts[worker] = lines
    spies = {}
    if shutil.which("py-spy"):  # native stacks of the workers and their vouchers, all at once
        for _, pid in workers:
            for target in [pid] + _children(pid):
                spies[target] = subprocess.Popen(["py-spy", "dump", "--native", "--pid", str(target)],
                                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for worker, pid in workers:
        lines = texts[worker]
        for target in [pid] + _children(pid):
            if target in spies:
                try:
                    lines.append(spies[target].communicate(timeout=60)[0])
                except subprocess.TimeoutExpired:
                    spies[target].kill()
                    lines.append(spies[target].communicate()[0])
        with open(os.path.join(folder, f"{worker.replace('/', '_')}.txt"), "w") as f:
            f.write("\n".join(lines) + "\n")
    if shutil.which("py-spy"):  # the driver's own, last: is it the one stuck?
        spy = subprocess.run(["py-spy", "dump", "--pid", str(job.proc.pid)], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, timeout=60)
        with open(os.path.join(folder, "driver.stacks"), "w") as f:
            f.write(spy.stdout)
    for name in os.listdir(job.dir):
        if name.startswith("stacks."):
            shutil.copy(job.path(name), folder)
    for name in ("events.jsonl", "driver.out"):
        if os.path.exists(job.path(name)):
            shutil.copy(job.path(name), folder)


def hunt(args, say=print):
    rng = random.Random(args.seed)
    folder = tempfile.mkdtemp(prefix="hvdlite-stall-")
    job = Job(args.backend, args.ranks, folder, args.plain)
    stalls, recoveries, kills = [], [], 0
    try:
        def wait(predicate, limit, since=None, watch=True, since_wall=None):
            """Poll until predicate(); a stall on the way (nothing moved for --stall seconds, or
            `since`, a kill's time, is --stall seconds ago) is dumped and timed, if `watch`."""
            deadline = time.monotonic() + limit
            stalled = None
            while not predicate():
                if time.monotonic() > deadline:
                    raise RuntimeError("no progress within the limit")
                time.sleep(0.02)
                moved = job.poll()
                if watch and stalled is None and (time.monotonic() - job.last_move > args.stall or
                                        since is not None and time.monotonic() - since > args.stall):
                    where = os.path.join(args.keep, f"stall-{len(stalls) + 1}")
                    say(f"  STALL after kill {kills}: {'no recovery' if moved else 'nothing moved'} "
                        f"for {args.stall:g} s; dumping to {where}", flush=True)
                    stalled = (job.newest, where)
                    dump(job, where)
            job.poll()
            if stalled is not None:
                # After a kill: from the kill to the first step of a newer world (driver events
                # meanwhile, a world formed without a wedged survivor, say, are no progress).
                # Otherwise from the last thing before it to the first after it.
                length = (job.last_step[0] - since_wall if since_wall is not None
                          else job.first_after(stalled[0]) - stalled[0])
                if length < args.stall:  # the hunt itself was not running, not the job
                    say(f"  no stall: the job moved within {length:.1f} s", flush=True)
                    shutil.rmtree(stalled[1], ignore_errors=True)
                else:
                    stalls.append(length)
                    say(f"  stall {len(stalls)}: {length:.1f} s; dump in {stalled[1]}", flush=True)

        full = lambda: job.rounds and job.rounds[-1]["size"] == args.ranks  # noqa: E731
        wait(full, RECOVERY_LIMIT * 2, watch=False)  # the job starts: no re-form to time yet
        while kills < args.kills:
            formed = len(job.rounds)
            target = job.rounds[-1]
            if kills % 2:  # wait until it trains
                wait(lambda: job.last_step and job.last_step[1] >= target["round"], RECOVERY_LIMIT)
            else:
                time.sleep(rng.uniform(0, args.early))
            members = job.members(target)
            if not members:
                wait(full, RECOVERY_LIMIT)
                continue
            victim = rng.choice(members)
            try:
                os.kill(victim, signal.SIGKILL)
            except ProcessLookupError:
                continue
            kills += 1
            killed_at, since = time.time(), time.monotonic()
            # The next world (the survivors, or one formed meanwhile) trains, then the full one.
            wait(lambda: len(job.rounds) > formed and job.last_step and job.last_step[1] > target["round"],
                 RECOVERY_LIMIT, since, since_wall=killed_at)
            recoveries.append(job.last_step[0] - killed_at)
            wait(full, RECOVERY_LIMIT)
            if kills % 50 == 0:
                say(f"  kills {kills}, stalls {len(stalls)}, failed {len(job.failed)}, recovery median "
                    f"{statistics.median(recoveries):.2f} s max {max(recoveries):.2f} s", flush=True)
    finally:
        job.stop()
        if not stalls:
            shutil.rmtree(folder, ignore_errors=True)
    return kills, stalls, recoveries, job.failed, job.left_behind


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", choices=("numpy", "torch"), default="numpy")
    p.add_argument("--ranks", type=int, default=32)
    p.add_argument("--kills", type=int, default=500)
    p.add_argument("--stall", type=float, default=5.0, help="seconds without progress that are a stall")
    p.add_argument("--early", type=float, default=0.6, help="latest kill after a world forms, seconds")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--plain", action="store_true", help="start every worker fresh (--no-preload), "
                   "not forked from a preloaded template")
    p.add_argument("--keep", default=os.path.join(tempfile.gettempdir(), "hvdlite-stalls"),
                   help="where stall dumps go")
    args = p.parse_args()
    if args.backend == "numpy" and not os.path.exists(PYGLOO):
        sys.exit(f"numpy: no pygloo venv at {PYGLOO}")
    start = time.monotonic()
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))  # clean up the job
    kills, stalls, recoveries, failed, left_behind = hunt(args)
    median = statistics.median(recoveries) if recoveries else float("nan")
    print(f"{args.backend}, {args.ranks} ranks: {kills} kills in {time.monotonic() - start:.0f} s, "
          f"{len(stalls)} stalls (> {args.stall:g} s without progress)"
          + (f": {', '.join(f'{s:.1f}' for s in stalls)} s" if stalls else ""))
    causes = sorted({e.get("error") or f"code {e['code']}" for e in failed})
    print(f"  workers that failed on their own: {len(failed)}" + (f" ({'; '.join(causes)})" if causes else ""))
    held = [e["after"] for e in left_behind if e.get("held")]
    print(f"  members left behind: {len(held)} held in a pygloo collective (after "
          f"{', '.join(f'{s:.1f}' for s in held) or '-'} s), {len(left_behind) - len(held)} others")
    if recoveries:
        print(f"  kill -> next step: median {median:.2f} s, max {max(recoveries):.2f} s "
              f"({max(recoveries) / median:.1f}x the median)")
        slow = sorted(recoveries)[::-1]
        print(f"  over 1 s: {sum(r > 1 for r in recoveries)}, over 2 s: {sum(r > 2 for r in recoveries)}; "
              f"slowest: {', '.join(f'{r:.2f}' for r in slow[:5])} s")


if __name__ == "__main__":
    main()
