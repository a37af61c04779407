"""Recovery of a Hugging Face Trainer from a kill -9, hvdlite against torchrun, in one run.

    python bench/transformers.py [--trials 5] [--baseline-trials 2]

Three workers on localhost train a tiny GPT-2 (bench/scripts/trainer_step.py); one of them is
killed with kill -9, and the time is taken from the kill to the survivors' next optimizer step:
- hvdlite: ElasticTrainer, `hvdlite run -H localhost:3 --min-np 1`: the survivors roll back to
  the last commit and go on in their processes (the killed slot comes back after 1 s, and its
  new worker joins before the next trial);
- torchrun: the same script with transformers' Trainer under `torchrun --max-restarts 3`,
  which restarts every worker: each imports transformers, builds the model and the Trainer, and
  starts training from the beginning (no checkpoint is read, which only favours torchrun).
"""
import argparse
import os
import random
import statistics

from elastic import hvdlite_trials, summary, torchrun_trials

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "trainer_step.py")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--baseline-trials", type=int, default=2)
    args = p.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", flush=True)
    env = {"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    ours = [r[0] for r in hvdlite_trials(3, args.trials, random.Random(0), env, SCRIPT, ready=300)]
    print(f"hvdlite ElasticTrainer (in-process): kill -9 -> survivors' next optimizer step: {summary(ours)}",
          flush=True)
    theirs = torchrun_trials(args.baseline_trials, env, SCRIPT, timeout=300)
    lost = sum(t is None for t in theirs)
    print(f"torchrun --max-restarts (every worker restarted): kill -9 -> next optimizer step: {summary(theirs)}"
          + (f"; {lost} of {len(theirs)} restarts took no step within 300 s" if lost else ""))
    ours, theirs = [v for v in ours if v is not None], [v for v in theirs if v is not None]
    if ours and theirs:
        print(f"recovery, torchrun median / hvdlite median: {statistics.median(theirs) / statistics.median(ours):.1f}x")


if __name__ == "__main__":
    main()
