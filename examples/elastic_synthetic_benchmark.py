"""Elastic synthetic benchmark: images per second of a small ResNet on random data, as
Horovod's pytorch_synthetic_benchmark_elastic.py (the model is defined here: no torchvision).

hvdlite run -np 2 --min-np 1 --max-np 4 --host-discovery-script examples/discover_hosts.sh \
    python examples/elastic_synthetic_benchmark.py --num-iters 5
"""
import argparse
import timeit

import torch
import torch.nn.functional as F

import hvdlite.torch as hvd

parser = argparse.ArgumentParser(description="hvdlite elastic synthetic benchmark")
parser.add_argument("--fp16-allreduce", action="store_true", help="fp16 compression for allreduce")
parser.add_argument("--batch-size", type=int, default=16, help="input batch size per rank")
parser.add_argument("--image-size", type=int, default=32)
parser.add_argument("--num-warmup-batches", type=int, default=2)
parser.add_argument("--num-batches-per-iter", type=int, default=5)
parser.add_argument("--num-iters", type=int, default=5)
args = parser.parse_args()


class Block(torch.nn.Module):
    def __init__(self, channels_in, channels, stride):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(channels_in, channels, 3, stride, 1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(channels)
        self.conv2 = torch.nn.Conv2d(channels, channels, 3, 1, 1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(channels)
        self.shortcut = torch.nn.Sequential()
        if stride != 1 or channels_in != channels:
            self.shortcut = torch.nn.Sequential(torch.nn.Conv2d(channels_in, channels, 1, stride, bias=False),
                                                torch.nn.BatchNorm2d(channels))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class SmallResNet(torch.nn.Module):
    """A ResNet-18-like network, narrower and with one block per stage."""

    def __init__(self, classes=10):
        super().__init__()
        self.stem = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, 1, 1, bias=False),
                                        torch.nn.BatchNorm2d(16), torch.nn.ReLU())
        self.stages = torch.nn.Sequential(Block(16, 16, 1), Block(16, 32, 2), Block(32, 64, 2))
        self.fc = torch.nn.Linear(64, classes)

    def forward(self, x):
        return self.fc(F.adaptive_avg_pool2d(self.stages(self.stem(x)), 1).flatten(1))


hvd.init()
torch.manual_seed(0)
model = SmallResNet()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size())
compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                     compression=compression)

data = torch.randn(args.batch_size, 3, args.image_size, args.image_size)
target = torch.randint(0, 10, (args.batch_size,))


def benchmark_step(state):
    optimizer.zero_grad()
    F.cross_entropy(model(data), target).backward()
    optimizer.step()
    state.batch += 1
    state.commit()


def log(text):
    if hvd.rank() == 0:
        print(text, flush=True)


@hvd.elastic.run
def run_benchmark(state):
    log(f"world of {hvd.size()} ranks; running warmup...")
    timeit.timeit(lambda: benchmark_step(state), number=args.num_warmup_batches)
    log("running benchmark...")
    for state.iter in range(state.iter, args.num_iters):
        seconds = timeit.timeit(lambda: benchmark_step(state), number=args.num_batches_per_iter)
        rate = args.batch_size * args.num_batches_per_iter / seconds
        log(f"iter #{state.iter}: {rate:.1f} img/sec per rank")
        state.img_secs.append(rate)
    mean = sum(state.img_secs) / len(state.img_secs)
    total = hvd.allreduce(torch.tensor(mean), op=hvd.Sum).item()
    log(f"img/sec per rank: {mean:.1f}; total on {hvd.size()} ranks: {total:.1f}")


def on_reset():
    for group in optimizer.param_groups:
        group["lr"] = 0.01 * hvd.size()


state = hvd.elastic.TorchState(model, optimizer, iter=0, batch=0, img_secs=[])
state.register_reset_callbacks([on_reset])
run_benchmark(state)
