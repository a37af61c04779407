"""Bitwise recovery (scripts/determinism_job.py): a job whose workers are replaced at the same
world size ends with the parameters and momentum of a run with no fault, and a resized job
trains every sample of every epoch exactly once. Real workers, real gloo, real kill -9."""
import json
import os
import random
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch

from hvdlite.driver.decisions.plan import host_of
from hvdlite.torch import generators
from hvdlite.torch.elastic import ElasticSampler, TorchState as ElasticTorchState
from hvdlite.worker import checkpoints
from jobs import SCRIPTS, Job, discovery, progress, run_job, skip_without_partitions, slot_pid, ssh_flags
import slurmcluster

JOB = [sys.executable, os.path.join(SCRIPTS, "determinism_job.py")]
FIXED = ["-np", "2", "--min-np", "2", "--max-np", "2", "--blacklist-cooldown-range", "600", "600"]
SAME_SIZE = ["-H", "localhost:3", *FIXED]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def draws():
    return random.random(), float(np.random.rand()), torch.rand(3).tolist()


def test_the_generators_come_back_from_a_checkpoint_file_and_draw_as_before(tmp_path):
    """Through the checked unpickler as they are (no trusted class needed)."""
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    np.random.randn()  # numpy's state holds a cached gaussian now
    captured = generators.capture()
    expected = draws()
    fd, direct = checkpoints.create(str(tmp_path / "c"))
    with os.fdopen(fd, "wb"):
        checkpoints.dump(fd, 7, "lineage", {"ranks": [captured]}, direct)
    commit, _, state = checkpoints.load(str(tmp_path / "c"))
    draws()
    generators.put(state["ranks"][0])
    assert commit == 7 and draws() == expected


def test_a_commit_of_gradients_and_the_scripts_generators_loads_from_a_checkpoint_file(tmp_path):
    """What TorchState's snapshot adds (gradients, None among them; each rank's own generators
    of every kind) goes through the checked unpickler with no trusted class."""
    model = torch.nn.Linear(2, 1)
    own = {"g": torch.Generator().manual_seed(1), "n": np.random.default_rng(2), "r": random.Random(3),
           "mt": np.random.Generator(np.random.MT19937(4))}
    state = ElasticTorchState(model, **own)
    model(torch.ones(2)).sum().backward()
    model.bias.grad = None
    state.save()
    commit, snapshot = state._snapshot()
    snapshot["ranks"] = [state._rank_now()]
    fd, direct = checkpoints.create(str(tmp_path / "c"))
    with os.fdopen(fd, "wb"):
        checkpoints.dump(fd, commit, "lineage", snapshot, direct)
    expected = (torch.rand(1, generator=own["g"]).item(), own["n"].random(), own["r"].random(), own["mt"].random())
    grad = model.weight.grad.clone()
    model(torch.ones(2)).sum().backward()
    _, _, loaded = checkpoints.load(str(tmp_path / "c"))
    state._gradients.load_saved(loaded["gradients"])  # what _load_snapshot does, less the world
    state._gradients.restore()
    state._put_rank_saved(loaded["ranks"][0])
    assert torch.equal(model.weight.grad, grad) and model.bias.grad is None
    assert (torch.rand(1, generator=own["g"]).item(), own["n"].random(), own["r"].random(),
            own["mt"].random()) == expected


@pytest.mark.parametrize("epoch_commit", [False, True])
def test_a_rollback_at_an_epochs_end_draws_the_next_epoch_as_before(epoch_commit):
    """In one process, no world: the commit after an epoch's last batch (the re-entered loop's
    loader makes an iterator over nothing, drawing a base seed), or the epoch's own commit after
    the loop (the next epoch's iterator draws as it did), restored: the next epoch draws what
    the run without the rollback drew."""
    def run(rollback):
        torch.manual_seed(0)
        sampler = ElasticSampler(list(range(8)), seed=0)
        loader = torch.utils.data.DataLoader(sampler.dataset, batch_size=4, sampler=sampler)
        state = ElasticTorchState(sampler=sampler)

        def epoch(number):
            sampler.set_epoch(number)
            draws = []
            for batch_idx, _ in enumerate(loader):
                sampler.record_batch(batch_idx, 4)
                draws.append(torch.rand(1).item())  # dropout
                state.save()  # what commit() does locally
            return draws

        epoch(0)
        epoch(1)
        if epoch_commit:
            state.save()
        if rollback:
            state.restore()
            if not epoch_commit:
                epoch(1)
        return epoch(2)

    assert run(rollback=True) == run(rollback=False)


def final(log_dir):
    with open(os.path.join(log_dir, "final.json")) as f:
        return json.load(f)


def reference_run(folder, **env):
    folder.mkdir(exist_ok=True)
    r = run_job([*SAME_SIZE, *JOB], folder, timeout=120, env={"LOG_DIR": str(folder), **env})
    assert r.code == 0, r.stderr[-3000:]
    return final(folder)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The fault-free run's final.json, by loader: run once for the tests that compare with it."""
    runs = {}

    def of(loader):
        if loader not in runs:
            runs[loader] = reference_run(tmp_path_factory.mktemp(f"reference-{loader}"), LOADER=loader)
        return runs[loader]
    return of


def member(job, rank):
    rounds = [e["members"] for e in job.events() if e["event"] == "round_complete"]
    return next(slot for slot, r in rounds[-1].items() if r == rank)


def held(log_dir):
    return os.path.exists(os.path.join(log_dir, "held"))


def is_held(log_dir):
    """Ready when every worker waits at HOLD_AT."""
    return lambda _: held(log_dir)


def at_step(log_dir, step, worlds):
    """Ready once the `worlds`th world formed and rank 0 committed `step`."""
    return lambda events: sum(e["event"] == "round_complete" for e in events) >= worlds and progress(log_dir) >= step


def faulted(log_dir, env, faults, start=None, within=60, finish=120):
    """Run the job (`start(env)` -> Job; default: two ranks and a spare slot here) with
    LOG_DIR=log_dir and `env`; for each (ready, fault) of `faults` in turn, once ready(events),
    fault(job); then let the held workers go and wait for the job's end; its Result."""
    env = {"LOG_DIR": str(log_dir), **env}
    with (start or (lambda env: Job([*SAME_SIZE, *JOB], log_dir, env)))(env) as job:
        for ready, fault in faults:
            job.wait_for(ready, within)
            fault(job)
        (log_dir / "go").touch()
        return job.finish(finish)


def kill(victim, sig=signal.SIGKILL):
    """The fault: `sig` to the worker of rank `victim`."""
    return lambda job: os.kill(slot_pid(job, member(job, victim)), sig)


def test_kill_9_replaced_at_the_same_size_is_bitwise_the_fault_free_run(tmp_path, reference):
    """A DataLoader with worker processes over an ElasticSampler; rank 0 holds the durable
    writer and was the sync's source before ranks stayed put. Three kills in one job, a spare
    slot for each (a killed slot cools down for the whole run): rank 1 mid-epoch 0 and rank 0
    mid-epoch 1, each once rank 0 committed that step (a rollback re-enters the epoch), then
    rank 1 while every worker waits before epoch 1's own commit (HOLD_AT): the rollback goes to
    step 24's, the last of the epoch, whose loop the script then re-enters with nothing left in
    it. (torchdata's StatefulDataLoader is killed in the graceful chain below.)"""
    kills = [(6, 1), (20, 0), ("epoch1", 1)]
    expected = reference("elastic_sampler")
    log_dir = tmp_path / "faulty"
    log_dir.mkdir()
    faults = [(is_held(log_dir) if isinstance(at, str) else at_step(log_dir, at, worlds=n + 1), kill(victim))
              for n, (at, victim) in enumerate(kills)]
    r = faulted(log_dir, {"LOADER": "elastic_sampler", "HOLD_AT": "epoch1"}, faults,
                lambda env: Job(["-H", f"localhost:{2 + len(kills)}", *FIXED, *JOB], log_dir, env))
    assert r.code == 0, r.stderr[-3000:]
    formed = r.of("round_complete")
    assert len(formed) >= 1 + len(kills), "a kill did not re-form the world"
    assert formed[-1]["commit"] == 25, "the rollback of the held kill went elsewhere"
    got = final(log_dir)
    assert got["epochs"] == [True] * 3
    assert got["hash"] == expected["hash"], "parameters or momentum differ from the fault-free run"


# Other ways to write the loop (STYLE in scripts/determinism_job.py), each with one fault here
# (bench/determinism.py --styles runs every style with every fault).
STYLES = {"mixed": "after,accumulate,scaler,scheduler,two-optimizers,generators",
          "ddp": "ddp,accumulate,scaler,scheduler,generators"}


@pytest.mark.parametrize("style, fault, point", [("mixed", signal.SIGKILL, "14"), ("ddp", signal.SIGTERM, "13")])
def test_other_loop_styles_replaced_at_the_same_size_are_bitwise_the_fault_free_run(tmp_path, style, fault, point):
    """Gradients zeroed after step() and accumulated across commits, a GradScaler whose scale
    moves every step, schedulers, two optimizers, the script's own generators; DDP with
    no_sync(). mixed: rank 1 killed before step 14's commit, so the survivor rolls back to
    step 13's, taken between the two backward passes of a step (its gradients and the
    optimizer's pending pass are the commit's); ddp: rank 1 leaves (SIGTERM) at step 13's
    commit, and its replacement takes the gradients held there from the root."""
    env = {"STYLE": STYLES[style], "EPOCHS": "2"}
    expected = reference_run(tmp_path / "reference", **env)
    log_dir = tmp_path / "faulty"
    log_dir.mkdir()
    r = faulted(log_dir, {"HOLD_AT": point, **env}, [(is_held(log_dir), kill(1, fault))])
    assert r.code == 0, r.stderr[-3000:]
    formed = r.of("round_complete")
    assert len(formed) >= 2 and formed[1]["commit"] == 14, "the fault did not re-form the world at step 13's commit"
    got = final(log_dir)
    assert got["epochs"] == [True] * 2
    assert got["scales"] == expected["scales"] and len(set(got["scales"])) == 1, "the loss scales differ"
    assert got["hash"] == expected["hash"], "parameters or optimizer state differ from the fault-free run"


def test_a_state_handler_that_syncs_from_rank_0_is_refused_when_the_commit_is_elsewhere(tmp_path):
    """Rank 0 killed: its replacement holds nothing, the root is rank 1, and a handler written
    for Horovod broadcasts from rank 0: the job ends with one line naming it, nothing synced
    from the empty rank."""
    r = faulted(tmp_path, {"HOLD_AT": "5", "EPOCHS": "1", "STYLE": "rank0-handler"}, [(is_held(tmp_path), kill(0))])
    assert r.code != 0 and not os.path.exists(tmp_path / "final.json")
    assert "the state handler TallyHandler of 'tally' syncs from rank 0, but the newest commit is at rank 1" \
        in r.stderr, r.stderr[-3000:]
    assert "Traceback" not in r.stderr, r.stderr[-3000:]


def replaced_on_a_spare(log_dir, expected, start, fault, victim, spare):
    """Start the job (`start(env)` -> Job), hold it before step 20's commit, `fault(host)` the
    host of rank `victim`, let go: the `spare` host takes that rank and the result is the
    fault-free run's (`expected`, the localhost one: ranks stay put and gloo sums in rank
    order, so where the ranks run does not change a bit)."""
    r = faulted(log_dir, {"HOLD_AT": "20", "PYTHONPATH": ROOT},
                [(is_held(log_dir), lambda job: fault(host_of(member(job, victim))))], start, within=120, finish=240)
    assert r.code == 0, r.stderr[-3000:]
    formed = r.of("round_complete")
    assert len(formed) >= 2 and formed[1]["commit"] == 20, "the fault did not re-form the world at step 20's commit"
    got = final(log_dir)
    assert got["epochs"] == [True] * 3
    assert got["hash"] == expected["hash"], "parameters or momentum differ from the fault-free run"
    assert {host_of(slot): rank for slot, rank in formed[-1]["members"].items()}[spare] == victim


def test_a_partitioned_ssh_host_replaced_by_a_spare_is_bitwise_the_fault_free_run(tmp_path, reference, ssh_hosts):
    """Rank 0's host cut off (every packet dropped, no FIN): the survivor, rank 1, holds the
    state and rank 0's generators; the spare host becomes rank 0 from them."""
    expected = reference("elastic_sampler")
    hosts = ssh_hosts(3)
    cut = []

    def partition(host):
        cut.append(host)
        hosts.partition(host)
    try:
        skip_without_partitions(hosts)
        replaced_on_a_spare(
            tmp_path, expected,
            lambda env: Job([*ssh_flags(hosts), "-H", "host-1:1,host-2:1,host-3:1", *FIXED, *JOB], tmp_path, env),
            partition, victim=0, spare="host-3")
    finally:
        for host in cut:
            hosts.heal(host)
        hosts.close()  # the cut host's worker, still waiting on its peers, with the rest


def test_a_killed_slurm_node_replaced_by_a_spare_is_bitwise_the_fault_free_run(tmp_path, reference):
    """salloc -N3 --no-kill, two ranks: every process of rank 1's node killed (its slurmd
    too) while the job waits before a commit; the third node takes rank 1."""
    reason = slurmcluster.missing()
    if reason:
        pytest.skip(reason)
    expected = reference("elastic_sampler")
    cluster = slurmcluster.SlurmCluster(3, slurmd_timeout=10)
    try:
        replaced_on_a_spare(
            tmp_path, expected,
            lambda env: Job([*FIXED, *JOB], tmp_path, {**env, "SLURM_CONF": cluster.conf, "SALLOC_NO_KILL": ""},
                            prefix=["salloc", "-N3", "--no-kill"]),
            cluster.kill_node, victim=1, spare="n3")
    finally:
        cluster.close()  # the killed node's namespace and the others


def test_a_resized_run_trains_every_sample_exactly_once_each_epoch(tmp_path):
    log_dir = tmp_path
    schedule = [[0, ["localhost:2"]], [5, ["localhost:3"]], [14, ["localhost:1"]], [20, ["localhost:2"]]]
    # Each size is waited for (RESIZE): a driver slow to act on a change must not skip a world.
    r = run_job([*discovery(tmp_path, schedule), "--min-np", "1", *JOB], log_dir, timeout=180,
                env={"LOG_DIR": str(log_dir), "STEP_SLEEP": "0.1", "RESIZE": "8:3,17:1"})
    assert r.code == 0, r.stderr[-3000:]
    assert sorted({e["size"] for e in r.of("round_complete")}) == [1, 2, 3]
    assert final(log_dir)["epochs"] == [True] * 3


# Commits: 12 steps an epoch, then the epoch's own commit (step 24's is commit 25, epoch 1's 26).
@pytest.mark.parametrize("loader, stops, killed", [
    ("elastic_sampler", [("20", 21), ("24", 25), ("epoch1", 26)], None), ("stateful", [("24", 25)], (20, 0))],
    ids=["elastic_sampler-20-24-epoch1", "stateful-kill-0-at-20-stop-24"])
def test_graceful_stops_then_reruns_from_the_checkpoint_dir_are_bitwise_the_fault_free_run(
        tmp_path, reference, loader, stops, killed):
    """Each stop lands at the commit the test picks (every worker waits before it until it
    heard of the stop), and each run resumes the last one's: mid-epoch, the last step of an
    epoch (the rerun re-enters a loop with nothing left in it, which draws a loader seed the
    uninterrupted run never drew), and the epoch's own commit (the rerun's next loop draws
    one it did draw). One job, stopped and run again at each point in turn: a resume that
    drew or held anything wrong changes the bytes of the run that ends it. `killed`: (step,
    rank) killed -9 in the first run once rank 0 committed that step, the spare slot taking
    its place: torchdata's StatefulDataLoader held in the state, its place each rank's own."""
    args = [*SAME_SIZE, "--checkpoint-dir", str(tmp_path / "ckpt"), *JOB]
    expected = reference(loader)
    log_dir = tmp_path / "log"
    log_dir.mkdir()
    env = {"LOG_DIR": str(log_dir), "LOADER": loader}
    for n, point in enumerate([*(point for point, _ in stops), None]):  # None: the run to the end
        run = tmp_path / f"run{n}"
        run.mkdir()
        if point is None:
            r = run_job(args, run, timeout=120, env=env)
            assert r.code == 0, r.stderr[-3000:]
        else:
            (log_dir / "held").unlink(missing_ok=True)
            with Job(args, run, {**env, "HOLD_AT": point}) as job:
                if killed and n == 0:
                    job.wait_for(at_step(log_dir, killed[0], worlds=1), 60)
                    kill(killed[1])(job)
                job.wait_for(lambda _: held(log_dir), 60)
                job.proc.send_signal(signal.SIGTERM)
                r = job.finish(60)
            assert r.code == 75, r.stderr[-3000:]
            assert not (killed and n == 0) or len(r.of("round_complete")) >= 2, "the kill did not re-form the world"
        assert n == 0 or f"resumed from commit {stops[n - 1][1]} " in r.stderr, (n, r.stderr[-3000:])
    assert final(log_dir)["hash"] == expected["hash"]


def test_bench_quick_finds_every_run_equal_and_every_epoch_exactly_once(tmp_path):
    """bench/determinism.py --quick: one kill -9, one SIGTERM leaver, one resize with a kill."""
    bench = os.path.join(os.path.dirname(SCRIPTS), "..", "bench", "determinism.py")
    done = subprocess.run([sys.executable, bench, "--quick", "--dir", str(tmp_path)], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    rows = {line.split()[0]: line.split()[1:] for line in done.stdout.split("epochs exactly-once")[-1].splitlines()[1:4]}
    assert rows == {"kill": ["1", "0", "2", "0"], "term": ["1", "0", "2", "0"], "resize": ["-", "-", "2", "0"]}
