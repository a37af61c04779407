"""Soak: a long elastic job re-formed again and again must not grow.

    python bench/soak.py [--backend torch|numpy|both] [--rounds 1000] [--early 10]

A real job on 3 local slots (tests/scripts/elastic_job.py on torch, numpy_elastic_job.py on
pygloo via .venv-pygloo) is re-formed until its world number reaches --rounds: slots 1 and 2
are killed with SIGKILL in turn, the survivors re-form, the slot's cooldown ends, a new worker
is launched and joins, and the world re-forms again (two re-forms per kill). Slot 0 is never
killed: its worker lives through every round. At round --early and at the last round the
driver's and slot 0's worker's RSS, descriptors and threads are printed, with the sizes of
the driver's own tables (read inside the driver by a probe thread). Goal: flat within 5%.

What a descriptor points at (inode numbers left out) and every thread's name are compared
too, and printed when they differ. The survivor's readings are taken again until it is down
to its fewest so far (round --early) or back to that (the last round), for at most the
collective timeout (see settle): a survivor can hold an old group that long, which is no
growth; growth never settles ("GROWTH:"). The rounds after which the survivor held more than
at round --early are listed with how long it did, and the slowest re-form is named (a
survivor left waiting in a broken world's collective shows there).
"""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter

from hvdlite import defaults

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = os.path.join(ROOT, "tests", "scripts")
PYGLOO = os.path.join(ROOT, ".venv-pygloo", "bin", "python")
JOBS = {"torch": [sys.executable, os.path.join(SCRIPTS, "elastic_job.py")],
        "numpy": [PYGLOO, os.path.join(SCRIPTS, "numpy_elastic_job.py")]}
ROUND_TIMEOUT = 120.0  # seconds one kill may take to re-form and rejoin
PROBE_TMP = ".probe-tmp"  # suffix of the file the driver probe writes before renaming it
SETTLE_MARGIN = 5.0  # seconds past the collective timeout a last reading may take to settle


def probe_driver(sizes_path, argv):
    """Run `hvdlite run ...` in this process with a thread writing the sizes of the driver's
    tables to sizes_path every 0.2 s."""
    import hvdlite.driver.job as job_module
    from hvdlite.cli import main
    seen = {}

    class Core(job_module.ElasticCore):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            seen["core"] = self

    class Job(job_module.Job):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            seen["job"] = self

    job_module.ElasticCore, job_module.Job = Core, Job

    def write():
        while True:
            time.sleep(0.2)
            core, job = seen.get("core"), seen.get("job")
            if core is None or job is None or job.executor is None:
                continue
            try:
                sizes = {"incarnations": len(core.workers), "launch_counts": len(core.launches),
                         "blacklist": len(core.blacklist.until),
                         "handles": len(job.executor.handles), "outputs": len(job.executor.outputs),
                         "assign_waits": job.rendezvous.waiting(), **job.server.sizes()}
            except RuntimeError:  # a table changed size while read: the next turn reads it
                continue
            with open(sizes_path + PROBE_TMP, "w") as f:
                json.dump(sizes, f)
            os.replace(sizes_path + PROBE_TMP, sizes_path)
    threading.Thread(target=write, daemon=True).start()
    return main(argv)


def usage(pid):
    """(RSS MB, descriptors, threads) of a process."""
    with open(f"/proc/{pid}/status") as f:
        rss = int(f.read().split("VmRSS:")[1].split()[0]) / 1024
    return round(rss, 1), len(os.listdir(f"/proc/{pid}/fd")), len(os.listdir(f"/proc/{pid}/task"))


def thread_names(pid):
    names = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/comm") as f:
            names.append(f.read().strip())
    return sorted(names)


def fd_targets(pid):
    """What each descriptor of a process points at, the inode numbers of sockets, pipes and
    anonymous inodes left out (a fresh socket per round is no growth; one more socket is)."""
    targets = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = re.sub(r":\[\d+\]$", "", os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            continue  # closed meanwhile
        if not target.endswith(PROBE_TMP):  # the probe's own file, open for a moment each 0.2 s
            targets.append(target)
    return sorted(targets)


def inventory(pid):
    """(descriptor targets, thread names) of a process, each a sorted list."""
    return {"fds": fd_targets(pid), "threads": thread_names(pid)}


class Events:
    """A JSON-lines file (the job's event log, its steps), read as it grows; with keep=False
    only the lines of the last read are kept (a job's steps are millions)."""

    def __init__(self, path, keep=True):
        self.path, self.offset, self.all, self.keep = path, 0, [], keep

    def read(self):
        try:
            with open(self.path) as f:
                f.seek(self.offset)
                text = f.read()
        except FileNotFoundError:
            return self.all
        complete = text[:text.rfind("\n") + 1]
        self.offset += len(complete.encode())
        new = [json.loads(line) for line in complete.splitlines() if line.strip()]
        self.all = self.all + new if self.keep else new
        return self.all

    def wait(self, predicate, timeout, proc):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [e for e in self.read() if predicate(e)]
            if found:
                return found[-1]
            if proc.poll() is not None:
                raise RuntimeError(f"the driver exited with {proc.returncode}")
            time.sleep(0.02)
        raise TimeoutError("the job did not re-form in time")


def soak(backend, rounds, early, say=print, gloo_timeout=None):
    """Run the soak; returns {"early": figures, "late": figures, "holds": [...]} (figures:
    driver, worker, sizes, inventories; see measure and holds). `gloo_timeout`: the job's
    --gloo-timeout-seconds (None: its default), which bounds how long a survivor may still
    hold an old group (see settle)."""
    with tempfile.TemporaryDirectory(prefix=f"soak-{backend}-") as tmp:
        events, sizes = os.path.join(tmp, "events.jsonl"), os.path.join(tmp, "sizes.json")
        timeout = defaults.COLLECTIVE_TIMEOUT if gloo_timeout is None else gloo_timeout
        argv = ["run", "--event-log", events, "-H", "localhost:3", "--min-np", "1",
                "--blacklist-cooldown-range", "0.05", "0.05", "--gloo-timeout-seconds", str(timeout),
                *JOBS[backend]]
        env = {**os.environ, "LOG_DIR": tmp, "TOTAL_STEPS": "100000000", "STEP_SLEEP": "0.01",
               "PYTHONPATH": ROOT + os.pathsep + SCRIPTS}
        err = open(os.path.join(tmp, "driver.err"), "w")
        proc = subprocess.Popen([sys.executable, __file__, "--probe", sizes, "--", *argv], env=env,
                                stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
        figures, series = {}, []
        try:
            log_, steps = Events(events), Events(os.path.join(tmp, "steps.jsonl"), keep=False)
            log_.wait(lambda e: e["event"] == "round_complete", ROUND_TIMEOUT, proc)
            victim = 1
            while True:
                current = [e for e in log_.read() if e["event"] == "round_complete"][-1]
                if current["round"] >= early and "early" not in figures:
                    # Taken again until the survivor is down to its fewest so far.
                    fewest = min([fds + threads for _, _, (_, fds, threads) in series], default=0)
                    figures["early"] = settle(measure(proc.pid, log_, sizes, current["round"]), log_,
                                              lambda got: len(got["fds"]) + len(got["threads"]) <= fewest,
                                              timeout + SETTLE_MARGIN)
                if current["round"] >= rounds:
                    quiet = figures["early"]["inventory"]["worker"]
                    figures["late"] = settle(measure(proc.pid, log_, sizes, current["round"]), log_,
                                             lambda got: got == quiet, timeout + SETTLE_MARGIN)
                    figures["holds"] = holds(series, figures["early"]["worker"])
                    figures["slowest"] = max((e["reformed_in"], e["round"]) for e in log_.read()
                                             if e["event"] == "round_complete" and "reformed_in" in e)
                    return figures
                slot = f"localhost/{victim}"
                victim = 3 - victim
                pid = [e["pid"] for e in log_.read() if e["event"] == "worker_start" and e["slot"] == slot][-1]
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:  # it died on its own first: the world re-forms anyway
                    pass
                joined = log_.wait(lambda e: e["event"] == "round_complete" and e["round"] > current["round"]
                                   and e["size"] == 3, ROUND_TIMEOUT, proc)
                # Kills land while the world trains (one during its connect is another test).
                steps.wait(lambda e: e["round"] >= joined["round"], ROUND_TIMEOUT, proc)
                series.append((joined["round"], time.monotonic(), usage(survivor(log_))))
                if current["round"] % 100 < 2:
                    say(f"  {backend}: round {current['round']}")
        except (RuntimeError, TimeoutError) as e:
            with open(err.name) as f:
                raise RuntimeError(f"{backend}: {e}; the driver said:\n" + "".join(f.readlines()[-15:])) from None
        finally:
            stop(proc)
            for pid in {e["pid"] for e in Events(events).read() if e["event"] == "worker_start"}:
                try:  # workers lead their own process groups
                    os.killpg(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            err.close()


def stop(proc):
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def survivor(log_):
    """The pid of slot 0's worker, which lives through every round."""
    return [e["pid"] for e in log_.read() if e["event"] == "worker_start" and e["slot"] == "localhost/0"][-1]


def measure(driver, log_, sizes_path, round_):
    time.sleep(1.0)  # the last launch's output drained, the probe wrote a fresh reading
    worker = survivor(log_)
    with open(sizes_path) as f:
        sizes = json.load(f)
    return {"round": round_, "driver": usage(driver), "worker": usage(worker), "sizes": sizes,
            "inventory": {"driver": inventory(driver), "worker": inventory(worker)}}


def settle(reading, log_, done, limit):
    """`reading` with the survivor's part taken again, a second apart, until done(its
    inventory) or for at most `limit` seconds. A survivor may hold an old group that long:
    when a collective failed, gloo can leave another one of that group waiting out the
    collective timeout (a pair whose incoming message was meant for the failed one reads no
    more, so it sees neither the cut nor the peer's exit), and the group's release waits for
    it. Growth never settles. The driver's part stays the first reading: its kept-alive KV
    connections close after 10 s without a re-form. Adds "first", the survivor's first
    inventory, and "settled_in", seconds (None: never)."""
    first, start = reading["inventory"]["worker"], time.monotonic()
    while not done(reading["inventory"]["worker"]) and time.monotonic() - start < limit:
        time.sleep(1.0)
        worker = survivor(log_)
        reading["worker"], reading["inventory"]["worker"] = usage(worker), inventory(worker)
    settled = done(reading["inventory"]["worker"])
    return {**reading, "first": first, "settled_in": round(time.monotonic() - start, 1) if settled else None}


def holds(series, baseline):
    """The spans of rounds after which the survivor had more descriptors or threads than at
    the early reading: first and last such round, seconds until it was back (None: it was
    not by the end), most extra descriptors and threads."""
    spans, current = [], None
    for round_, at, (_, fds, threads) in series:
        extra = (fds - baseline[1], threads - baseline[2])
        if max(extra) <= 0:
            if current is not None:
                current["seconds"] = round(at - current.pop("since"), 1)
            current = None
            continue
        if current is None:
            current = {"first": round_, "since": at, "seconds": None, "fds": 0, "threads": 0}
            spans.append(current)
        current.update(last=round_, fds=max(current["fds"], extra[0]), threads=max(current["threads"], extra[1]))
    if current is not None:
        del current["since"]
    return spans


def report(backend, figures):
    early, late = figures["early"], figures["late"]
    print(f"{backend}: round {early['round']} -> round {late['round']}")
    for who in ("driver", "worker"):
        for i, what in enumerate(("RSS MB", "descriptors", "threads")):
            a, b = early[who][i], late[who][i]
            print(f"  {who:6} {what:11} {a:>8} -> {b:>8}  ({(b - a) / a * 100:+.1f}%)")
    for reading in (early, late):
        if reading["first"] != reading["inventory"]["worker"]:
            print(f"  survivor at round {reading['round']}, first reading: "
                  f"{changes(reading['inventory']['worker']['fds'], reading['first']['fds'])} descriptors, "
                  f"{changes(reading['inventory']['worker']['threads'], reading['first']['threads'])} threads; "
                  f"settled in {reading['settled_in']} s")
    for who in ("driver", "worker"):
        for what in ("fds", "threads"):
            before, after = early["inventory"][who][what], late["inventory"][who][what]
            if after != before:
                grew = Counter(after) - Counter(before)
                print(f"  {'GROWTH: ' if grew else ''}{who} {what}: {changes(before, after)}")
    for span in figures["holds"]:
        print(f"  survivor held more after rounds {span['first']}-{span['last']}: +{span['fds']} "
              f"descriptors, +{span['threads']} threads, back within {span['seconds']} s")
    print(f"  slowest re-form: {figures['slowest'][0]} s (world {figures['slowest'][1]})")
    for name in early["sizes"]:
        print(f"  driver table {name:14} {early['sizes'][name]:>5} -> {late['sizes'][name]:>5}")


def changes(before, after) -> str:
    """What `after` has more and fewer of than `before` (two lists)."""
    more, fewer = Counter(after) - Counter(before), Counter(before) - Counter(after)
    return f"+{sorted(more.elements())} -{sorted(fewer.elements())}"


def main():
    if sys.argv[1:2] == ["--probe"]:
        sys.exit(probe_driver(sys.argv[2], sys.argv[4:]))
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", choices=("torch", "numpy", "both"), default="both")
    p.add_argument("--rounds", type=int, default=1000)
    p.add_argument("--early", type=int, default=10)
    args = p.parse_args()
    backends = ["torch", "numpy"] if args.backend == "both" else [args.backend]
    for backend in backends:
        if backend == "numpy" and not os.path.exists(PYGLOO):
            print(f"numpy: skipped, no pygloo venv at {PYGLOO}")
            continue
        start = time.monotonic()
        figures = soak(backend, args.rounds, args.early)
        report(backend, figures)
        print(f"  ({time.monotonic() - start:.0f} s)")


if __name__ == "__main__":
    main()
