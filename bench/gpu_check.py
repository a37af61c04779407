"""hvdlite on a GPU machine, in one prepared run: under 8 minutes on one GPU, one line per check.

    python bench/gpu_check.py

- tests/test_gpu.py: 2-4 ranks sharing the GPU(s) over gloo, CUDA tensors through every
  collective, DistributedOptimizer, the broadcasts, TorchState and a checkpoint; a line per test;
- NCCL with two ranks on one GPU (raw torch.distributed, as facts for an NCCL path hvdlite does
  not have yet): a distinct NCCL_HOSTID per rank and the socket transport, to get past NCCL's
  "Duplicate GPU detected"; if an allreduce runs, rank 1 is killed (-9) inside the next one
  and rank 0 times its abort (polling is_completed(), never a timed wait) and a new world of
  one on a new store prefix;
- bench/allreduce.py on CUDA tensors, hvdlite against torch's own gloo on the same group, 4 B to
  256 MB: its ratio lines.

Where torch sees no GPU it prints one line saying so and exits 0.
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


def _run(argv, timeout, env=None):
    """(exit code or 'timed out', stdout + stderr) of argv, run from the repository's root."""
    try:
        done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "PYTHONPATH": ROOT, **(env or {})})
        return done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as e:
        out = e.stdout or b""
        return f"timed out ({timeout} s)", out.decode(errors="replace") if isinstance(out, bytes) else out


def check_tests():
    code, out = _run([sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "tests/test_gpu.py"], 300)
    lines = [line for line in out.splitlines() if "::" in line and any(w in line for w in ("PASSED", "FAILED", "SKIPPED", "ERROR"))]
    for line in lines:
        test, verdict = line.split(" ", 1)
        print(f"gpu test   {verdict.split()[0]:<7} {test.split('::', 1)[1]}", flush=True)
    if code != 0:
        print(f"gpu test   exit {code}; its last lines: {' | '.join(out.strip().splitlines()[-6:])}", flush=True)


def check_nccl_two_ranks_one_gpu():
    with tempfile.TemporaryDirectory() as tmp:
        env = {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"}
        procs = [subprocess.Popen([sys.executable, __file__, "--nccl-rank", str(rank), tmp], cwd=ROOT,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  env={**os.environ, **env, "NCCL_HOSTID": f"hvdlite-check-{rank}"})
                 for rank in (0, 1)]
        try:
            out0, _ = procs[0].communicate(timeout=120)
        except subprocess.TimeoutExpired:
            out0 = "rank 0 timed out (120 s)"
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


def check_allreduce_bench():
    code, out = _run([sys.executable, "bench/allreduce.py", "--spawn", "--np", "2", "--device", "cuda",
                      "--iters", "10", "--sizes", *map(str, SIZES)], 240)
    rows = [line for line in out.splitlines() if line.strip().endswith(")") and "x (" in line]
    for row in rows:
        print(f"allreduce  {row.strip()}", flush=True)
    if code != 0 or not rows:
        print(f"allreduce  exit {code}; its last lines: {' | '.join(out.strip().splitlines()[-6:])}", flush=True)


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "--nccl-rank":
        nccl_rank(int(sys.argv[2]), sys.argv[3])
    if not torch.cuda.is_available():
        print(f"gpu_check: torch {torch.__version__} sees no GPU here: nothing to check", flush=True)
        return
    print(f"gpu_check: torch {torch.__version__}, {torch.cuda.device_count()} x "
          f"{torch.cuda.get_device_name(0)}, NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}", flush=True)
    for check in (check_tests, check_nccl_two_ranks_one_gpu, check_allreduce_bench):
        start = time.monotonic()
        check()
        print(f"{check.__name__}: {time.monotonic() - start:.0f} s", flush=True)


if __name__ == "__main__":
    main()
