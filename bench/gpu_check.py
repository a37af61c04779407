"""hvdlite on a GPU machine, in one prepared run: under 8 minutes on one GPU, one line per check.

    python bench/gpu_check.py

- tests/test_gpu.py: 2-4 ranks sharing the GPU(s) over gloo, CUDA tensors through every
  collective, DistributedOptimizer, the broadcasts, TorchState and a checkpoint; a line per test;
- tests/test_gpu_nccl.py: hvdlite's NCCL path (hvdlite/torch/backend.py): a world of one on
  NCCL through the whole API, and an `hvdlite run --backend nccl` elastic job of two ranks on the
  one GPU (each its own NCCL_HOSTID, the socket transport) whose rank 1 is killed (-9) inside an
  allreduce: rank 0 aborts, forms the next world on NCCL in its process, and says how long it took;
- NCCL with two ranks on one GPU in raw torch.distributed, the facts under the above: a distinct
  NCCL_HOSTID per rank and the socket transport, to get past NCCL's "Duplicate GPU detected";
  if an allreduce runs, rank 1 is killed (-9) inside the next one and rank 0 times its abort
  (polling is_completed(), never a timed wait) and a new world of one on a new store prefix;
- bench/allreduce.py on CUDA tensors, 4 B to 256 MB: hvdlite against torch's own group on the
  same backend, over gloo and over NCCL: its ratio lines.

Each check has a timeout of its own, cut to what is left of the 8 minutes, so one that hangs
leaves the others their time. Where torch sees no GPU it prints one line saying so and exits 1.
"""
import datetime
import os
import signal
import subprocess
import sys
import tempfile
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MB = 1 << 20
SIZES = (4, MB, 16 * MB, 64 * MB, 256 * MB)
BUDGET = 460.0  # seconds for every check together (under 8 minutes with the start)
_deadline = []  # when the budget ends, set by main()


def _left(timeout: float) -> float:
    """`timeout`, cut to what is left of the budget."""
    return max(1.0, min(timeout, _deadline[0] - time.monotonic())) if _deadline else timeout


def _run(argv, timeout, env=None):
    """(exit code or 'timed out', stdout + stderr) of argv, run from the repository's root."""
    timeout = round(_left(timeout))
    try:
        done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "PYTHONPATH": ROOT, **(env or {})})
        return done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as e:
        out = e.stdout or b""
        return f"timed out ({timeout} s)", out.decode(errors="replace") if isinstance(out, bytes) else out


def check_tests(path="tests/test_gpu.py", timeout=120):
    code, out = _run([sys.executable, "-m", "pytest", "-v", "-s", "-p", "no:cacheprovider", path], timeout)
    for line in out.splitlines():
        if line.startswith("recovered on "):  # test_gpu_nccl's job, its survivor's times
            print(f"gpu test   {line}", flush=True)
    lines = [line for line in out.splitlines() if "::" in line and any(w in line for w in ("PASSED", "FAILED", "SKIPPED", "ERROR"))]
    for line in lines:
        test, verdict = line.split(" ", 1)
        print(f"gpu test   {verdict.split()[0]:<7} {test.split('::', 1)[1]}", flush=True)
    if code != 0:
        print(f"gpu test   exit {code}; its last lines: {' | '.join(out.strip().splitlines()[-6:])}", flush=True)


def check_nccl_tests():
    check_tests("tests/test_gpu_nccl.py", 110)


def check_nccl_two_ranks_one_gpu():
    with tempfile.TemporaryDirectory() as tmp:
        env = {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"}
        procs = [subprocess.Popen([sys.executable, __file__, "--nccl-rank", str(rank), tmp], cwd=ROOT,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  env={**os.environ, **env, "NCCL_HOSTID": f"hvdlite-check-{rank}"})
                 for rank in (0, 1)]
        timeout = round(_left(60))
        try:
            out0, _ = procs[0].communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            out0 = f"rank 0 timed out ({timeout} s)"
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                proc.wait()
        said = [line for line in out0.splitlines() if line.startswith("nccl ")]
        for line in said or [f"nccl       no answer from rank 0: {' | '.join(out0.strip().splitlines()[-4:])}"]:
            print(line, flush=True)


def nccl_rank(rank: int, folder: str) -> None:
    """One rank of check_nccl_two_ranks_one_gpu, both on cuda:0."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d
    torch.cuda.set_device(0)
    store = dist.FileStore(os.path.join(folder, "store"), 2)
    start = time.perf_counter()
    try:
        dist.init_process_group("nccl", store=dist.PrefixStore("w1", store), rank=rank, world_size=2,
                                timeout=datetime.timedelta(seconds=60), device_id=torch.device("cuda", 0))
        x = torch.ones(1 << 20, device="cuda")
        dist.all_reduce(x)
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 - what NCCL says is the finding
        print(f"nccl       two ranks on one GPU: refused: {str(e).strip().splitlines()[-1][:200]}", flush=True)
        os._exit(0)
    if rank == 0:
        print(f"nccl       two ranks on one GPU: an allreduce ran (sum {x[0].item():g}, init + allreduce "
              f"{time.perf_counter() - start:.2f} s)", flush=True)
    store.set(f"ready{rank}", "1")
    store.wait(["ready0", "ready1"])
    if rank == 1:
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGKILL)  # inside rank 0's next allreduce
    work = dist.all_reduce(x, async_op=True)
    deadline = time.monotonic() + 3  # it cannot end: its peer is gone
    while not work.is_completed() and time.monotonic() < deadline:
        time.sleep(0.01)
    t0 = time.perf_counter()
    c10d._abort_process_group()  # every group, the default one too
    aborted = time.perf_counter() - t0
    t0 = time.perf_counter()
    dist.init_process_group("nccl", store=dist.PrefixStore("w2", store), rank=0, world_size=1,
                            device_id=torch.device("cuda", 0))
    y = torch.ones(4, device="cuda")
    dist.all_reduce(y)
    torch.cuda.synchronize()
    print(f"nccl       survivor: abort {aborted:.3f} s, a new world of one and its first allreduce "
          f"{time.perf_counter() - t0:.3f} s (the allreduce {'completed' if work.is_completed() else 'still pending'} "
          f"when aborted; CUDA tensor kept: {x.device})", flush=True)
    dist.destroy_process_group()
    os._exit(0)


def check_allreduce_bench(over="gloo", timeout=110):
    code, out = _run([sys.executable, "bench/allreduce.py", "--spawn", "--np", "2", "--device", "cuda",
                      "--backend", over, "--iters", "10", "--sizes", *map(str, SIZES)], timeout)
    rows = [line for line in out.splitlines() if line.strip().endswith(")") and "x (" in line]
    for row in rows:
        print(f"allreduce  {over:<5} {row.strip()}", flush=True)
    if code != 0 or not rows:
        print(f"allreduce  {over:<5} exit {code}; its last lines: {' | '.join(out.strip().splitlines()[-6:])}",
              flush=True)


def check_allreduce_bench_nccl():
    check_allreduce_bench("nccl", 60)


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "--nccl-rank":
        nccl_rank(int(sys.argv[2]), sys.argv[3])
    if not torch.cuda.is_available():
        sys.exit(f"gpu_check: torch {torch.__version__} sees no GPU here: nothing checked")
    nccl = ".".join(map(str, torch.cuda.nccl.version())) if torch.distributed.is_nccl_available() else "none"
    print(f"gpu_check: torch {torch.__version__}, {torch.cuda.device_count()} x "
          f"{torch.cuda.get_device_name(0)}, NCCL {nccl}", flush=True)
    _deadline.append(time.monotonic() + BUDGET)
    for check in (check_tests, check_nccl_tests, check_nccl_two_ranks_one_gpu, check_allreduce_bench,
                  check_allreduce_bench_nccl):
        if time.monotonic() >= _deadline[0]:
            print(f"{check.__name__}: skipped, the {BUDGET:g} s are spent", flush=True)
            continue
        start = time.monotonic()
        check()
        print(f"{check.__name__}: {time.monotonic() - start:.0f} s", flush=True)


if __name__ == "__main__":
    main()
