"""Allreduce and DistributedOptimizer overhead against raw gloo, on 2+ ranks.

    hvdlite run -np 2 python bench/allreduce.py
    python bench/allreduce.py --spawn [--np 2]     # its own launcher, no driver needed
    python bench/allreduce.py --spawn --sizes 4    # only these sizes (bytes), for a quick look
    python bench/allreduce.py --spawn --device cuda  # GPU tensors, the ranks sharing the GPUs
    python bench/allreduce.py --spawn --device cuda --backend nccl  # on NCCL, twins too

Prints, on rank 0:
- hvd.allreduce / hvd.allreduce_ against pg.allreduce on the very same group (target >= 0.95x;
  with --backend nccl the world's NCCL group, torch's ProcessGroupNCCL):
  the median over runs of the twin's time over hvdlite's in the run beside it, with a ~90%
  confidence interval (a ratio of two medians swung 0.5-2x at 1 MB under load);
- pg.allreduce against itself, measured the same way: what the harness alone reads (its noise
  and any bias of the order), to set the rows above against;
- a DistributedOptimizer step on a model of many small tensors, fused, against the same step
  with one allreduce per gradient tensor (target >= 2x faster).
"""
import argparse
import datetime
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.distributed as dist

import hvdlite.torch as hvd
from hvdlite.torch import backend, optimizer as hvd_optimizer, runtime
from hvdlite.worker.world import WorldInfo
from stats import median_interval  # bench/, the script's folder

MB = 1024 * 1024
SIZES = (4, 1 * MB, 16 * MB, 64 * MB)  # bytes; 4 B shows the fixed cost per call
RAW_IN_PLACE = "pg.allreduce, sum in place"
HVD_IN_PLACE = "hvd.allreduce_(op=Sum)"
RAW_NEW = "clone + pg.allreduce + div_"
HVD_NEW = "hvd.allreduce (Average)"
AGAIN = "pg.allreduce, again (A/A)"
FUSED = "DistributedOptimizer, fused"
TWINS = ((RAW_IN_PLACE, HVD_IN_PLACE), (RAW_NEW, HVD_NEW), (RAW_IN_PLACE, AGAIN))


DEVICE = torch.device("cpu")  # where the allreduced tensors live (--device)


def _done() -> None:
    """Wait for the GPU's queued work: gloo's own CUDA allreduce returns with its copies queued."""
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, iters):
    times = []
    for _ in range(iters):
        # Start together, so time a rank spends waiting for a late peer is not billed here.
        runtime.process_group().barrier(dist.BarrierOptions()).wait()
        start = time.perf_counter()
        fn()
        _done()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def runs(iters, nbytes):
    return max(iters, min(2000, 2000 * MB // nbytes))


def bench_allreduce(iters, sizes=SIZES):
    """Per size: ({case: median seconds}, {hvdlite case: its twin's seconds / its own, per
    run}). Each hvdlite case has a raw gloo twin doing the same work by hand, so the ratio is
    hvdlite's own overhead."""
    pg = backend.data(runtime.process_group(), torch.empty(0, device=DEVICE))
    pg = getattr(pg, "group", pg)  # NCCL's: torch's own group, not hvdlite's polled face
    options = dist.AllreduceOptions()
    options.reduceOp = dist.ReduceOp.SUM

    def raw_average(tensor):
        out = tensor.clone()
        pg.allreduce([out], options).wait()
        return out.div_(pg.size())

    rows = []
    for nbytes in sizes:
        tensor = torch.randn(nbytes // 4, device=DEVICE)
        cases = {RAW_IN_PLACE: lambda: pg.allreduce([tensor], options).wait(),
                 HVD_IN_PLACE: lambda: hvd.allreduce_(tensor, op=hvd.Sum),
                 RAW_NEW: lambda: raw_average(tensor),
                 HVD_NEW: lambda: hvd.allreduce(tensor),
                 AGAIN: lambda: pg.allreduce([tensor], options).wait()}
        for fn in cases.values():  # warm up: first touches, gloo buffers
            fn()
        # Each twin pair on its own, in turns (AB BA ...): a noisy neighbour hits a case and
        # its twin alike, and each case follows itself as often as its twin (interleaving all
        # the cases, hvdlite's in-place case came always after another, and its A/A read
        # 0.98-1.00x). Each run's ratio pairs a case with its twin run next to it. Runs: about
        # 2 GB a case, at most 2,000 (at 1 MB, 400 runs left a ~90% interval of 0.92-1.02x).
        medians, ratios = {}, {}
        for raw, ours in TWINS:
            samples = {raw: [], ours: []}
            for run in range(runs(iters, nbytes)):
                for name in ((raw, ours) if run % 2 == 0 else (ours, raw)):
                    samples[name].append(timed(cases[name], 1))
            ratios[ours] = [a / b for a, b in zip(samples[raw], samples[ours])]
            for name in (raw, ours):
                medians.setdefault(name, statistics.median(samples[name]))
        rows.append((nbytes, medians, ratios))
    return rows


class ManyTensors(torch.nn.Module):
    """60 small linear layers: 120 parameter tensors of 128 B to 4 KiB."""

    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(32, 32) for _ in range(60))

    def forward(self, x):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x


def _distributed(optimizer, model, fusion_threshold):
    saved = os.environ.get(hvd_optimizer.FUSION_THRESHOLD_ENV)
    if fusion_threshold is not None:
        os.environ[hvd_optimizer.FUSION_THRESHOLD_ENV] = fusion_threshold
    try:
        return hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    finally:
        os.environ.pop(hvd_optimizer.FUSION_THRESHOLD_ENV, None)
        if saved is not None:
            os.environ[hvd_optimizer.FUSION_THRESHOLD_ENV] = saved


def bench_optimizer(iters):
    """{way of averaging the gradients: median seconds of a training step}."""
    torch.manual_seed(0)
    x = torch.randn(8, 32)
    results = {}
    for name, wrap, threshold in ((FUSED, True, None),
                                  ("one hvd.allreduce_ per tensor, then step", False, None),
                                  ("DistributedOptimizer, HVDLITE_FUSION_THRESHOLD=0", True, "0")):
        model = ManyTensors()
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        if wrap:
            opt = _distributed(opt, model, threshold)

        def train_step():
            opt.zero_grad()
            model(x).sum().backward()
            if not wrap:
                for p in model.parameters():
                    hvd.allreduce_(p.grad)
            opt.step()
        for _ in range(3):
            train_step()
        results[name] = timed(train_step, iters)
    return len(list(model.parameters())), results


def report(iters, sizes):
    rows = bench_allreduce(iters, sizes)
    tensors, steps = bench_optimizer(iters)
    if hvd.rank() != 0:
        return
    print(f"{hvd.size()} ranks, {torch.get_num_threads()} torch threads each, tensors on {DEVICE.type} "
          f"over {'nccl' if backend.active() else 'gloo'}; "
          f"max({iters}, min(2000, 2000 / size in MB)) runs per allreduce pair, {iters} per training step;"
          f" ratio: median over runs of the twin's time / hvdlite's in the run beside it (~90% CI)")
    print(f"\n{'size':>5}  {'case':<28} {'ms':>8} {'GB/s':>6}  {'raw twin / hvdlite':>18}")
    for nbytes, cases, ratios in rows:
        for name in dict.fromkeys(name for pair in TWINS for name in pair):  # each case once
            seconds = cases[name]
            size = f"{nbytes // MB}MB" if nbytes >= MB else f"{nbytes}B"
            line = f"{size:>5}  {name:<28} {seconds * 1e3:8.3f} {nbytes / seconds / 1e9:6.2f}"
            if name in ratios:  # an hvdlite case, or the A/A
                low, high = median_interval(ratios[name])
                line += f"  {statistics.median(ratios[name]):16.2f}x ({low:.2f}-{high:.2f})"
            print(line)
    print(f"\ntraining step (zero_grad, forward, backward, step), model of {tensors} tensors")
    fused = steps[FUSED]
    for name, seconds in steps.items():
        print(f"  {name:<50} {seconds * 1e3:8.2f} ms  {seconds / fused:5.1f}x the fused step")


def spawn(np_, iters, sizes, device, backend_):
    with tempfile.TemporaryDirectory() as tmp:
        # One torch thread per rank unless told otherwise, as torchrun does: idle OpenMP
        # threads spin and steal the cores gloo's threads need.
        env = {"OMP_NUM_THREADS": "1", **os.environ}
        procs = [subprocess.Popen([sys.executable, __file__, "--child", str(rank), str(np_),
                                   os.path.join(tmp, "store"), "--iters", str(iters),
                                   "--sizes", *map(str, sizes), "--device", device,
                                   "--backend", backend_], env=env)
                 for rank in range(np_)]
        try:
            codes = [proc.wait(timeout=600) for proc in procs]
            return 0 if not any(codes) else 1
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()


def join_file_store(rank, size, path, nccl):
    store, timeout = dist.FileStore(path, size), datetime.timedelta(seconds=60)
    pg = dist.ProcessGroupGloo(dist.PrefixStore("gloo", store), rank, size, timeout)
    runtime.activate(pg, WorldInfo(rank=rank, size=size, local_rank=rank, local_size=size,
                                   cross_rank=0, cross_size=1, hostname="localhost"))
    if nccl:
        if size > torch.cuda.device_count():
            # Ranks sharing a GPU: NCCL refuses two ranks of one host on one device ("Duplicate
            # GPU detected") unless each says it is a host of its own, over sockets.
            os.environ.update(NCCL_HOSTID=f"bench-rank-{rank}", NCCL_P2P_DISABLE="1", NCCL_SHM_DISABLE="1")
        backend.adopt(dist.PrefixStore("nccl", store), rank, size, timeout)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--spawn", action="store_true", help="start --np local ranks itself")
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--iters", type=int, default=20, help="timed runs per case (>= 10)")
    parser.add_argument("--sizes", type=int, nargs="+", default=SIZES, help="bytes per allreduce")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                        help="where the allreduced tensors live (the training step stays on the CPU)")
    parser.add_argument("--backend", default="gloo", choices=("gloo", "nccl"),
                        help="--spawn: what carries the CUDA tensors (under hvdlite run: $HVDLITE_BACKEND)")
    parser.add_argument("--child", nargs=3, metavar=("RANK", "SIZE", "STORE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("bench/allreduce.py: --device cuda, but torch sees no GPU here")
    if args.spawn:
        sys.exit(spawn(args.np, args.iters, args.sizes, args.device, args.backend))
    if args.child:
        join_file_store(int(args.child[0]), int(args.child[1]), args.child[2], args.backend == "nccl")
    else:
        hvd.init()
    global DEVICE
    if args.device == "cuda":
        DEVICE = torch.device("cuda", hvd.local_rank() % torch.cuda.device_count())
        torch.cuda.set_device(DEVICE)
    report(max(args.iters, 10), args.sizes)
    hvd.barrier()


if __name__ == "__main__":
    main()
