"""Soak: a long elastic job re-formed again and again must not grow.

    python bench/soak.py [--backend torch|numpy|both] [--rounds 1000] [--early 10]

A real job on 3 local slots (tests/scripts/elastic_job.py on torch, numpy_elastic_job.py on
pygloo via .venv-pygloo) is re-formed until its world number reaches --rounds: slots 1 and 2
are killed with SIGKILL in turn, the survivors re-form, the slot's cooldown ends, a new worker
is launched and joins, and the world re-forms again (two re-forms per kill). Slot 0 is never
killed: its worker lives through every round. At round --early and at the last round the
driver's and slot 0's worker's RSS, descriptors and threads are printed, with the sizes of
the driver's own tables (read inside the driver by a probe thread). Goal: flat within 5%.
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = os.path.join(ROOT, "tests", "scripts")
PYGLOO = os.path.join(ROOT, ".venv-pygloo", "bin", "python")
JOBS = {"torch": [sys.executable, os.path.join(SCRIPTS, "elastic_job.py")],
        "numpy": [PYGLOO, os.path.join(SCRIPTS, "numpy_elastic_job.py")]}
ROUND_TIMEOUT = 120.0  # seconds one kill may take to re-form and rejoin


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
            with open(sizes_path + ".tmp", "w") as f:
                json.dump(sizes, f)
            os.replace(sizes_path + ".tmp", sizes_path)
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


def soak(backend, rounds, early, say=print):
    """Run the soak; returns {"early": figures, "late": figures} (figures: driver, worker, sizes)."""
    with tempfile.TemporaryDirectory(prefix=f"soak-{backend}-") as tmp:
        events, sizes = os.path.join(tmp, "events.jsonl"), os.path.join(tmp, "sizes.json")
        argv = ["run", "--event-log", events, "-H", "localhost:3", "--min-np", "1",
                "--blacklist-cooldown-range", "0.05", "0.05", *JOBS[backend]]
        env = {**os.environ, "LOG_DIR": tmp, "TOTAL_STEPS": "100000000", "STEP_SLEEP": "0.01",
               "PYTHONPATH": ROOT + os.pathsep + SCRIPTS}
        err = open(os.path.join(tmp, "driver.err"), "w")
        proc = subprocess.Popen([sys.executable, __file__, "--probe", sizes, "--", *argv], env=env,
                                stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
        figures = {}
        try:
            log_, steps = Events(events), Events(os.path.join(tmp, "steps.jsonl"), keep=False)
            log_.wait(lambda e: e["event"] == "round_complete", ROUND_TIMEOUT, proc)
            victim = 1
            while True:
                current = [e for e in log_.read() if e["event"] == "round_complete"][-1]
                if current["round"] >= early and "early" not in figures:
                    figures["early"] = measure(proc.pid, log_, sizes, current["round"])
                if current["round"] >= rounds:
                    figures["late"] = measure(proc.pid, log_, sizes, current["round"])
                    return figures
                slot = f"localhost/{victim}"
                victim = 3 - victim
                pid = [e["pid"] for e in log_.read() if e["event"] == "worker_start" and e["slot"] == slot][-1]
                os.kill(pid, signal.SIGKILL)
                joined = log_.wait(lambda e: e["event"] == "round_complete" and e["round"] > current["round"]
                                   and e["size"] == 3, ROUND_TIMEOUT, proc)
                # Kills land while the world trains (one during its connect is another test).
                steps.wait(lambda e: e["round"] >= joined["round"], ROUND_TIMEOUT, proc)
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


def measure(driver, log_, sizes_path, round_):
    time.sleep(1.0)  # the last launch's output drained, the probe wrote a fresh reading
    worker = [e["pid"] for e in log_.read() if e["event"] == "worker_start" and e["slot"] == "localhost/0"][-1]
    with open(sizes_path) as f:
        sizes = json.load(f)
    return {"round": round_, "driver": usage(driver), "worker": usage(worker), "sizes": sizes,
            "worker_threads": thread_names(worker)}


def report(backend, figures):
    early, late = figures["early"], figures["late"]
    print(f"{backend}: round {early['round']} -> round {late['round']}")
    for who in ("driver", "worker"):
        for i, what in enumerate(("RSS MB", "descriptors", "threads")):
            a, b = early[who][i], late[who][i]
            print(f"  {who:6} {what:11} {a:>8} -> {b:>8}  ({(b - a) / a * 100:+.1f}%)")
    if early["worker_threads"] != late["worker_threads"]:
        print(f"  worker thread names {early['worker_threads']} -> {late['worker_threads']}")
    for name in early["sizes"]:
        print(f"  driver table {name:14} {early['sizes'][name]:>5} -> {late['sizes'][name]:>5}")


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
