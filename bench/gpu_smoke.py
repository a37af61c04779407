"""hvdlite's GPU path in one command, under 6 minutes on one GPU, one line per stage.

    python bench/gpu_smoke.py

- versions: torch, CUDA, NCCL and the GPU; the torch APIs hvdlite uses that this torch lacks
  (hvdlite/torch/torchapis.py);
- nccl-raw: two ranks on the one GPU in raw torch.distributed, each its own NCCL_HOSTID, P2P and
  SHM off (NCCL refuses two ranks of one host on one GPU otherwise): allreduce bus bandwidth,
  4 B to 256 MB, the baseline;
- hvd-allreduce: hvdlite's allreduce_ on the same transport (the world's NCCL group), the same
  sizes, against the baseline;
- world-of-one: tests/test_gpu_nccl.py's world of one on NCCL through the whole API;
- ddp: a DistributedOptimizer step against torch DDP's, both on NCCL, two ranks on the GPU;
- kill: `hvdlite run --backend nccl` of three ranks on the GPU whose last rank is killed (-9)
  inside an allreduce, twice (tests/scripts/nccl_recover.py): the survivor's abort, re-form and
  next allreduce, timed;
- aborted-work: a collective pending when its communicator is aborted: what torch's work says
  (torch/handles.py's reason to raise whatever it says), and that hvdlite's wait raises;
- memory: the GPU memory of one process across five re-forms of a world of one (each making,
  using, aborting and dropping its NCCL group, as a survivor does).

Each stage runs in a process of its own with its own timeout, cut to what is left of the
budget: one that fails or hangs prints its line and leaves the others their time. The exit
status is 1 when a stage failed. Where torch sees no GPU it prints one line and exits 1.
"""
import argparse
import datetime
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.distributed as dist

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT]
MB = 1 << 20
SIZES = (4, 64 * 1024, MB, 16 * MB, 256 * MB)
BUDGET = 330.0  # seconds for every stage together: under 6 minutes with the start
RESULT = "RESULT "  # a stage's line starts with it


def result(line: str) -> None:
    print(f"{RESULT}{line}", flush=True)


def run_stages(stages, budget: float) -> int:
    """Run each (name, argv, timeout) in turn, each in a session of its own, killed with its
    children after min(timeout, what is left of `budget`) seconds; print one line for each.
    The number of stages that failed (timed out, exited non-zero or said nothing)."""
    deadline, failures = time.monotonic() + budget, 0
    for name, argv, timeout in stages:
        left = deadline - time.monotonic()
        if left < 1:
            print(f"{name:<14} skipped: the {budget:g} s are spent", flush=True)
            failures += 1
            continue
        start = time.monotonic()
        said, why = _run(argv, min(timeout, left))
        took = f"({time.monotonic() - start:.0f} s)"
        if why is None and said:
            print(f"{name:<14} {said} {took}", flush=True)
        else:
            failures += 1
            print(f"{name:<14} FAILED {why or 'no result'} {took}", flush=True)
    return failures


def _run(argv, timeout: float):
    """(the RESULT line's text or None, why it failed or None)."""
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, env={**os.environ, "PYTHONPATH": ROOT})
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired as e:
        os.killpg(proc.pid, signal.SIGKILL)
        try:
            out, _ = proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:  # (a process of a session of its own holds its output)
            out = e.output.decode(errors="replace") if isinstance(e.output, bytes) else e.output
        return None, f"timed out after {timeout:.0f} s; last: {_tail(out)}"
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # what the stage left running
        except ProcessLookupError:
            pass
    said = [line[len(RESULT):] for line in out.splitlines() if line.startswith(RESULT)]
    if proc.returncode != 0:
        return (said or [None])[-1], f"exit {proc.returncode}; last: {_tail(out)}"
    return (said or [None])[-1], None


def _tail(out: str) -> str:
    lines = [line.strip() for line in (out or "").strip().splitlines() if line.strip()]
    return " | ".join(lines[-3:])[-400:] or "nothing"


# --- the stages, each run as: gpu_smoke.py --stage NAME FOLDER [--rank R] ------------------

def _peer(name: str, folder: str):
    """Rank 1 of a two-rank stage, started by rank 0 (the stage's process) in its session."""
    return subprocess.Popen([sys.executable, __file__, "--stage", name, folder, "--rank", "1"],
                            env={**os.environ, **_one_gpu_env(1)})


def _one_gpu_env(rank: int) -> dict:
    return {"NCCL_HOSTID": f"hvdlite-smoke-{rank}", "NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1"}


def _timed(fn, nbytes: int) -> float:
    """Median seconds of fn() (the GPU synchronized), over as many runs as the size affords."""
    runs = 5 if nbytes >= 64 * MB else 20
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _size(nbytes: int) -> str:
    return f"{nbytes // MB}MB" if nbytes >= MB else f"{nbytes // 1024}KB" if nbytes >= 1024 else f"{nbytes}B"


def _bandwidths(allreduce, folder: str, name: str) -> dict:
    """Bus bandwidth (GB/s; two ranks: bytes / time) of allreduce(tensor) at each size."""
    out = {}
    for nbytes in SIZES:
        x = torch.ones(max(1, nbytes // 4), device="cuda")
        out[nbytes] = nbytes / _timed(lambda: allreduce(x), nbytes) / 1e9
    with open(os.path.join(folder, f"{name}.json"), "w") as f:
        json.dump(out, f)
    return out


def _hvdlite_pair(rank: int, folder: str, name: str):
    """This rank of a two-rank hvdlite world on the one GPU, on NCCL (bench/allreduce.py's)."""
    import allreduce  # bench/, beside this script
    torch.cuda.set_device(0)
    allreduce.join_file_store(rank, 2, os.path.join(folder, f"{name}.hvd"), True)


def stage_versions(rank, folder):
    from hvdlite.torch import torchapis
    nccl = ".".join(map(str, torch.cuda.nccl.version())) if dist.is_nccl_available() else "none"
    gone = torchapis.missing()
    result(f"torch {torch.__version__} ({'in' if torchapis.supported() else 'OUTSIDE'} the supported "
           f"2.11-2.13), CUDA {torch.version.cuda}, NCCL {nccl}, {torch.cuda.device_count()} x "
           f"{torch.cuda.get_device_name(0)}; torch APIs hvdlite uses missing: {', '.join(gone) or 'none'}")


def stage_nccl_raw(rank, folder):
    peer = _peer("nccl-raw", folder) if rank == 0 else None
    os.environ.update(_one_gpu_env(rank))
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", store=dist.FileStore(os.path.join(folder, "raw.store"), 2), rank=rank,
                            world_size=2, device_id=torch.device("cuda", 0))
    bandwidth = _bandwidths(dist.all_reduce, folder, "nccl-raw")
    dist.destroy_process_group()
    if peer:
        peer.wait(60)
        result("torch's allreduce bus bandwidth, GB/s: " + ", ".join(f"{_size(n)} {b:.2f}" for n, b in bandwidth.items()))


def stage_hvd_allreduce(rank, folder):
    import hvdlite.torch as hvd
    peer = _peer("hvd-allreduce", folder) if rank == 0 else None
    _hvdlite_pair(rank, folder, "hvd-allreduce")
    bandwidth = _bandwidths(lambda x: hvd.allreduce_(x, op=hvd.Sum), folder, "hvd-allreduce")
    if peer:
        peer.wait(60)
        try:
            with open(os.path.join(folder, "nccl-raw.json")) as f:
                raw = {int(n): b for n, b in json.load(f).items()}
        except OSError:  # (the baseline's stage failed)
            raw = {}
        result("hvdlite's, GB/s (its share of torch's): " + ", ".join(
            f"{_size(n)} {b:.2f} ({b / raw[n]:.2f}x)" if n in raw else f"{_size(n)} {b:.2f}"
            for n, b in bandwidth.items()))


def stage_world_of_one(rank, folder):
    test = "tests/test_gpu_nccl.py::test_a_world_of_one_on_nccl_through_the_api"
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test],
                          cwd=ROOT, capture_output=True, text=True)
    said = (done.stdout.strip().splitlines() or [_tail(done.stderr)])[-1]  # pytest's summary
    result(f"{test.split('::')[1]}: {said}")
    sys.exit(done.returncode or "passed" not in said)  # (skipped: this torch cannot use NCCL)


def stage_ddp(rank, folder):
    import hvdlite.torch as hvd
    from torch.nn.parallel import DistributedDataParallel
    peer = _peer("ddp", folder) if rank == 0 else None
    _hvdlite_pair(rank, folder, "ddp")
    dist.init_process_group("nccl", store=dist.FileStore(os.path.join(folder, "ddp.store"), 2), rank=rank,
                            world_size=2, device_id=torch.device("cuda", 0))
    torch.manual_seed(0)

    def model():
        layers = [torch.nn.Linear(1024, 1024) for _ in range(8)]
        return torch.nn.Sequential(*[m for layer in layers for m in (layer, torch.nn.ReLU())]).cuda()
    ddp = DistributedDataParallel(model(), device_ids=[0])
    ddp_opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    mine = model()
    hvd_opt = hvd.DistributedOptimizer(torch.optim.SGD(mine.parameters(), lr=0.01),
                                       named_parameters=mine.named_parameters())
    data = torch.randn(64, 1024, device="cuda")

    def step(net, opt):
        opt.zero_grad()
        net(data).square().mean().backward()
        opt.step()
    ratios = []
    for _ in range(10):
        ddp_time = _timed(lambda: step(ddp, ddp_opt), 0)
        hvd_time = _timed(lambda: step(mine, hvd_opt), 0)
        ratios.append(hvd_time / ddp_time)
    dist.destroy_process_group()
    if peer:
        peer.wait(60)
        result(f"DistributedOptimizer step / DDP step (8 x 1024² MLP, batch 64, NCCL): median "
               f"{statistics.median(ratios):.2f}x over 10 rounds (last: hvdlite {hvd_time * 1e3:.2f} ms, "
               f"DDP {ddp_time * 1e3:.2f} ms)")


def stage_kill(rank, folder):
    script = os.path.join(ROOT, "tests", "scripts", "nccl_recover.py")
    done = subprocess.run([sys.executable, "-m", "hvdlite.cli", "run", "--backend", "nccl", "-H", "localhost:3",
                           "--min-np", "1", "-np", "3", "--blacklist-cooldown-range", "600", "600",
                           sys.executable, script], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "KILL_MARK": os.path.join(folder, "killed")})
    said = [line.split("recovered", 1)[1].strip() for line in done.stdout.splitlines()
            if line.startswith("[0]") and "recovered" in line]  # (rank 1 survives the first kill too)
    result(f"{len(said)} of 2 recoveries: " + "; ".join(said) if said else f"no recovery said: {_tail(done.stderr)}")
    sys.exit(done.returncode or (len(said) != 2))


def stage_aborted_work(rank, folder):
    import hvdlite.torch as hvd
    from hvdlite.torch import backend
    from hvdlite.worker.errors import HorovodInternalError
    peer = _peer("aborted-work", folder) if rank == 0 else None
    _hvdlite_pair(rank, folder, "aborted-work")
    x = torch.ones(MB, device="cuda")
    hvd.allreduce_(x, op=hvd.Sum)  # both ranks: the communicator is made
    torch.cuda.synchronize()
    if rank == 1:
        time.sleep(60)  # never joins the next allreduce; rank 0's stage ends it
        return
    handle = hvd.allreduce_async_(x, op=hvd.Sum)
    time.sleep(1.0)
    polled = _polled(handle)
    before = polled.work.is_completed()
    nccl = backend._world[0]
    backend.abort()
    ended = nccl.abort_ended(20)
    after = polled.work.is_completed()
    try:
        polled.work.wait()
        torch_says = "wait() returned (no error)"
    except RuntimeError as e:
        torch_says = f"wait() raised {str(e).splitlines()[0][:80]}"
    try:
        hvd.synchronize(handle)
        hvdlite_says = "hvdlite's synchronize RETURNED the buffer"
    except HorovodInternalError:
        hvdlite_says = "hvdlite's synchronize raised HorovodInternalError"
    peer.kill()
    result(f"pending allreduce: completed before abort {before}; torch's abort returned {ended}; after it "
           f"is_completed() {after}, {torch_says}; {hvdlite_says}")
    sys.exit("RETURNED" in hvdlite_says)


def _polled(handle):
    """The NCCL work (handles.Polled) a Handle waits for, through the Handles it holds."""
    from hvdlite.torch import handles
    for work in handle._works:
        found = work if type(work) is handles.Polled else _polled(work) if isinstance(work, handles.Handle) else None
        if found is not None:
            return found
    return None


def stage_memory(rank, folder):
    import allreduce  # bench/, beside this script
    import hvdlite.torch as hvd
    from hvdlite.torch import backend, runtime
    torch.cuda.set_device(0)
    x = torch.ones(16 * MB // 4, device="cuda")
    used = []
    for world in range(6):
        allreduce.join_file_store(0, 1, os.path.join(folder, f"memory.{world}"), True)
        hvd.allreduce_(x, op=hvd.Sum)
        torch.cuda.synchronize()
        nccl = backend.leave()
        nccl.abort_ended(20)
        del nccl
        runtime.deactivate()
        free, total = torch.cuda.mem_get_info()
        used.append((total - free) / MB)
    result(f"GPU memory in use after each world (MB): {', '.join(f'{u:.0f}' for u in used)}; "
           f"growth over five re-forms {used[-1] - used[0]:+.0f} MB")


STAGES = {"versions": (stage_versions, 30), "nccl-raw": (stage_nccl_raw, 60),
          "hvd-allreduce": (stage_hvd_allreduce, 60), "world-of-one": (stage_world_of_one, 60),
          "ddp": (stage_ddp, 60), "kill": (stage_kill, 90), "aborted-work": (stage_aborted_work, 45),
          "memory": (stage_memory, 45)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--stage", nargs=2, metavar=("NAME", "FOLDER"), help=argparse.SUPPRESS)
    parser.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.stage:
        name, folder = args.stage
        STAGES[name][0](args.rank, folder)
        return
    if not torch.cuda.is_available():
        sys.exit(f"gpu_smoke: torch {torch.__version__} sees no GPU here: nothing ran")
    print(f"gpu_smoke: {len(STAGES)} stages, {BUDGET:g} s at most, started "
          f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC", flush=True)
    with tempfile.TemporaryDirectory() as folder:
        failed = run_stages([(name, [sys.executable, __file__, "--stage", name, folder], timeout)
                             for name, (_, timeout) in STAGES.items()], BUDGET)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
