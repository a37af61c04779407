"""Checkpoint cost on training: python bench/checkpoint.py [--state-mb 100] [--pairs 4] [--steps 20] [-np 1]

Runs the same job (bench/scripts/checkpoint_step.py: a model of --state-mb, every step trains
one batch and commits) without a checkpoint dir and with `--checkpoint-dir
--checkpoint-interval 0`, alternately, --pairs times each, and prints the median committing
step of each and their ratio (target <= 1.05), measured in this run, and what a step is made
of (the commit's share, minor page faults). The first steps of every job (warm-up) are left out.
It also prints what checksumming every byte of a checkpoint costs per 100 MB (zlib.crc32, the
one hvdlite uses, beside the other checksums Python has), measured here in this process.
"""
import argparse
import hashlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
STEP = os.path.join(HERE, "scripts", "checkpoint_step.py")
WARMUP = 3


def job(args, folder, durable):
    ckpt = os.path.join(folder, "ckpt")
    flags = ["--checkpoint-dir", ckpt, "--checkpoint-interval", "0"] if durable else []
    env = {**os.environ, "LOG_DIR": folder, "STATE_MB": str(args.state_mb), "STEPS": str(args.steps)}
    with open(os.path.join(folder, "driver.out"), "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "hvdlite.cli", "run", "-np", str(args.np), *flags,
                                 sys.executable, STEP], env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            code = proc.wait(args.timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
            raise SystemExit(f"a job took longer than {args.timeout} s; see {folder}/driver.out")
    if code != 0:
        raise SystemExit(f"a job failed ({code}); see {folder}/driver.out")
    with open(os.path.join(folder, "steps.txt")) as f:
        steps = [tuple(map(float, line.split())) for line in f][WARMUP:]  # (step, commit, faults)
    written = sorted(os.listdir(ckpt)) if durable else []
    return steps, written


def checksum_costs(megabytes=100, repeats=5) -> dict:
    """Milliseconds of one core each checksum takes over `megabytes` (the best of `repeats`)."""
    data = memoryview(os.urandom(megabytes << 20))
    candidates = {"zlib.crc32 (used)": lambda: zlib.crc32(data), "zlib.adler32": lambda: zlib.adler32(data),
                  "hashlib.sha1": lambda: hashlib.sha1(data).digest(),
                  "hashlib.blake2b": lambda: hashlib.blake2b(data).digest()}
    costs = {}
    for name, run in candidates.items():
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            run()
            best = min(best, time.perf_counter() - start)
        costs[name] = best * 1e3 * 100 / megabytes
    return costs


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--state-mb", type=int, default=100)
    p.add_argument("--pairs", type=int, default=4)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("-np", type=int, default=1)
    p.add_argument("--timeout", type=float, default=600)
    args = p.parse_args()
    times = {False: [], True: []}
    split = {False: [], True: []}
    for pair in range(args.pairs):
        for durable in ((False, True) if pair % 2 == 0 else (True, False)):  # ABBA: drift cancels
            folder = tempfile.mkdtemp(prefix="hvdlite-bench-ckpt-")
            try:
                steps, written = job(args, folder, durable)
            finally:
                shutil.rmtree(folder, ignore_errors=True)
            times[durable] += [s[0] for s in steps]
            split[durable] += steps
            print(f"pair {pair} {'checkpoint' if durable else 'memory    '}: median step "
                  f"{statistics.median(s[0] for s in steps) * 1e3:.1f} ms" +
                  (f", kept {written}" if durable else ""), flush=True)
    for durable in (False, True):
        step, commit, faults = (statistics.median(column) for column in zip(*split[durable]))
        print(f"{'checkpoint' if durable else 'memory    '}: step {step * 1e3:.1f} ms = training "
              f"{(step - commit) * 1e3:.1f} + commit {commit * 1e3:.1f}; {faults:.0f} minor faults a step")
    base, durable = statistics.median(times[False]), statistics.median(times[True])
    print(f"\nstate {args.state_mb} MB, -np {args.np}, {len(times[False])} steps each: committing step "
          f"{base * 1e3:.1f} ms without a checkpoint dir, {durable * 1e3:.1f} ms with "
          f"--checkpoint-interval 0: ratio {durable / base:.3f} (target <= 1.05)")
    costs = checksum_costs()
    print("checksum of every byte, ms of one core per 100 MB: " +
          ", ".join(f"{name} {ms:.0f}" for name, ms in costs.items()))


if __name__ == "__main__":
    main()
