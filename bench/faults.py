"""Randomized fault trials at scale: python bench/faults.py [--trials 100] [--first-seed 0] [--ssh].

Each trial is one seeded elastic job with kill -9, SIGSTOP and host changes injected at
random steps (see tests/faults.py); --ssh runs it on sshd test hosts in network namespaces
(root) and adds partitions. Prints the tally: trials, faults injected, commits lost, hangs,
orphans, other failures.
"""
import argparse
import collections
import contextlib
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from faults import LocalHosts, SSHHosts, run_trial  # noqa: E402
from sshhosts import TestHosts  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--trials", type=int, default=100)
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--ssh", action="store_true", help="sshd test hosts, with partitions")
    args = p.parse_args()
    with TestHosts(4) if args.ssh else contextlib.nullcontext() as ssh:
        trials(args, SSHHosts(ssh) if ssh else LocalHosts())


def trials(args, hosts):
    tally, faults, seconds = collections.Counter(), collections.Counter(), []
    for seed in range(args.first_seed, args.first_seed + args.trials):
        with tempfile.TemporaryDirectory() as log_dir:
            try:
                result = run_trial(seed, log_dir, hosts)
                faults.update(result["faults"])
                seconds.append(result["seconds"])
                tally["passed"] += 1
            except AssertionError as e:
                text = str(e)
                kind = ("commits lost" if "steps lost" in text or "differ" in text or "went back" in text
                        else "hangs" if "did not end" in text or "timed out" in text
                        else "orphans" if "left behind" in text else "other failures")
                tally[kind] += 1
                print(f"seed {seed}: {kind}: {text[-3000:]}", flush=True)
        print(f"trial {seed}: {dict(tally)}", flush=True)
    print(f"\ntrials {args.trials}  faults injected {sum(faults.values())} {dict(faults)}")
    print("  ".join(f"{k} {tally[k]}" for k in ("passed", "commits lost", "hangs", "orphans",
                                               "other failures")))
    if seconds:
        seconds.sort()
        print(f"trial time: median {seconds[len(seconds) // 2]:.1f} s, max {seconds[-1]:.1f} s")


if __name__ == "__main__":
    main()
