"""kill -9 of the driver during training: python bench/failover.py [--pairs 2] [--gap 3]

Each pair runs the same 2-worker job (tests/scripts/determinism_job.py, --checkpoint-dir,
--liveness-timeout 2) twice, and kills its driver with SIGKILL once rank 0 reached step 10;
`--gap` seconds later the same command runs again:
- take-over: the default --driver-grace: the workers train on without a driver and the new
  driver takes the same processes over. Measured: the steps made while no driver ran, the time
  from the new driver's start until every worker beat to it (its job_readopted event);
- today: --driver-grace equal to --liveness-timeout, as hvdlite was: the workers exit 75 after
  2 s (rank 0 writing its newest commit) and the new driver starts new ones, which resume from
  the disk. Measured: the time from the new driver's start until the resumed training's first step.
Both: the time from the kill to the job's end, and whether the final parameters equal the
fault-free run's (run once first). Ratios take-over / today.
"""
import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = os.path.join(ROOT, "tests", "scripts")
JOB = [sys.executable, os.path.join(SCRIPTS, "determinism_job.py")]
FLAGS = ["--liveness-timeout", "2", "-np", "2", "--min-np", "2", "--max-np", "2", "-H", "localhost:2"]
KILL_AT = 10  # rank 0's step


def progress(folder):
    try:
        with open(os.path.join(folder, "progress")) as f:
            return int(f.read() or 0)
    except (OSError, ValueError):
        return 0


def start(args, folder, name, extra, knobs):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, SCRIPTS, os.environ.get("PYTHONPATH", "")]),
           "LOG_DIR": os.path.join(folder, "log"), **knobs}
    out = open(os.path.join(folder, f"{name}.out"), "w")
    proc = subprocess.Popen([sys.executable, "-m", "hvdlite.cli", "run", "--event-log",
                             os.path.join(folder, f"{name}.jsonl"), *FLAGS, *extra, *JOB], env=env, stdout=out,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    return proc


def events(folder, name):
    try:
        with open(os.path.join(folder, f"{name}.jsonl")) as f:
            return [json.loads(line) for line in f if line.strip()]
    except OSError:
        return []


def wait(predicate, timeout, what):
    """predicate()'s first true value, polled; the bench ends naming `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out: {what}")
        time.sleep(0.01)
    return value


def trial(args, mode, knobs):
    folder = tempfile.mkdtemp(prefix=f"hvdlite-failover-{mode}-")
    log = os.path.join(folder, "log")
    os.makedirs(log)
    extra = ["--checkpoint-dir", os.path.join(folder, "ckpt"), "--checkpoint-interval", "0"]
    if mode == "today":
        extra += ["--driver-grace", "2"]
    first = start(args, folder, "first", extra, knobs)
    try:
        wait(lambda: progress(log) >= KILL_AT, args.timeout, "the first steps")
        first.send_signal(signal.SIGKILL)
        killed, at_kill = time.monotonic(), progress(log)
        first.wait(10)
        time.sleep(args.gap)
        at_rerun = progress(log)
        began = time.monotonic()
        second = start(args, folder, "second", extra, knobs)
        result = {"gap_steps": at_rerun - at_kill}
        if mode == "takeover":
            wait(lambda: any(e["event"] == "job_readopted" for e in events(folder, "second")), args.timeout,
                 "the take-over")
            result["back"] = time.monotonic() - began
            result["after_start"] = next(e["after"] for e in events(folder, "second") if e["event"] == "job_readopted")
            result["adopted"] = next(e["after"] for e in events(folder, "second") if e["event"] == "job_adopted")
        else:
            mark = os.path.getmtime(os.path.join(log, "progress"))
            wait(lambda: os.path.getmtime(os.path.join(log, "progress")) > mark, args.timeout, "a resumed step")
            result["back"] = time.monotonic() - began
        code = second.wait(args.timeout)
        result["end"] = time.monotonic() - killed
        if code != 0:
            raise SystemExit(f"{mode}: the rerun exited {code}; see {folder}")
        with open(os.path.join(log, "final.json")) as f:
            result["hash"] = json.load(f)["hash"]
        return result
    finally:
        for proc in (first, *([second] if "second" in locals() else [])):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=2)
    p.add_argument("--gap", type=float, default=3.0, help="seconds between the kill and the rerun (default 3)")
    p.add_argument("--epochs", type=int, default=10, help="of 12 steps each (default 10)")
    p.add_argument("--timeout", type=float, default=180.0)
    args = p.parse_args()
    knobs = {"EPOCHS": str(args.epochs), "WORKERS": "0", "STEP_SLEEP": "0.05"}
    reference = tempfile.mkdtemp(prefix="hvdlite-failover-reference-")
    os.makedirs(os.path.join(reference, "log"))
    proc = start(args, reference, "run", [], knobs)
    if proc.wait(args.timeout) != 0:
        raise SystemExit(f"the fault-free run failed; see {reference}")
    with open(os.path.join(reference, "log", "final.json")) as f:
        expected = json.load(f)["hash"]
    runs = {"takeover": [], "today": []}
    for _ in range(args.pairs):
        for mode in ("takeover", "today"):
            runs[mode].append(trial(args, mode, knobs))
    load = os.getloadavg()[0]
    for mode, results in runs.items():
        print(f"{mode}: " + "; ".join(
            f"{r['gap_steps']} steps while no driver ran, back {r['back']:.2f} s after the rerun's start"
            + (f" (its process started -> journal read and workers taken over {r['adopted']:.2f} s -> every "
               f"worker beat to it {r['after_start']:.2f} s)" if 'after_start' in r else "")
            + f", kill -> end {r['end']:.1f} s, parameters {'equal' if r['hash'] == expected else 'DIFFER'}"
            for r in results))
    med = {mode: {k: statistics.median(r[k] for r in results) for k in ("back", "end", "gap_steps")}
           for mode, results in runs.items()}
    print(f"ratios take-over / today (medians): rerun start -> a driver drives the training again (take-over: every worker beat to it; today: the first resumed step) {med['takeover']['back'] / med['today']['back']:.2f}x, "
          f"kill -> job end {med['takeover']['end'] / med['today']['end']:.2f}x; steps while no driver ran "
          f"{med['takeover']['gap_steps']:g} vs {med['today']['gap_steps']:g} (load {load:.1f})")


if __name__ == "__main__":
    main()
