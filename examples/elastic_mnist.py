"""Elastic MNIST-shaped training on generated data (no download), as Horovod's
pytorch_mnist_elastic.py: 28x28 one-channel images of 10 classes that a small convnet can tell
apart; the sampler, model, optimizer and scheduler survive workers coming and going.

hvdlite run -np 2 --min-np 1 --max-np 4 --host-discovery-script examples/discover_hosts.sh \
    python examples/elastic_mnist.py --epochs 2
"""
import argparse

import torch
import torch.nn.functional as F

import hvdlite.torch as hvd

parser = argparse.ArgumentParser(description="hvdlite elastic MNIST-shaped example")
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--lr", type=float, default=0.05)
parser.add_argument("--samples", type=int, default=2048, help="generated training images")
parser.add_argument("--batches-per-commit", type=int, default=4)
args = parser.parse_args()


def generated_digits(count, seed):
    """Images whose class decides which of 10 fixed patterns they show, plus noise."""
    g = torch.Generator().manual_seed(seed)
    patterns = torch.randn(10, 1, 28, 28, generator=torch.Generator().manual_seed(1234))
    labels = torch.randint(0, 10, (count,), generator=g)
    images = patterns[labels] + 0.8 * torch.randn(count, 1, 28, 28, generator=g)
    return torch.utils.data.TensorDataset(images, labels)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = torch.nn.Conv2d(10, 20, kernel_size=5)
        self.fc1 = torch.nn.Linear(320, 50)
        self.fc2 = torch.nn.Linear(50, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2(x), 2))
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


hvd.init()
torch.manual_seed(42)
train_set, test_set = generated_digits(args.samples, seed=0), generated_digits(512, seed=1)
train_sampler = hvd.elastic.ElasticSampler(train_set, shuffle=True, seed=0)
train_loader = torch.utils.data.DataLoader(train_set, batch_size=args.batch_size, sampler=train_sampler)

model = Net()
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.5)
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)


def metric_average(value):
    return hvd.allreduce(torch.tensor(float(value))).item()


def evaluate(epoch):
    model.eval()
    sampler = torch.utils.data.distributed.DistributedSampler(
        test_set, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=False)
    loss, correct, seen = 0.0, 0, 0
    with torch.no_grad():
        for x, y in torch.utils.data.DataLoader(test_set, batch_size=256, sampler=sampler):
            output = model(x)
            loss += F.cross_entropy(output, y, reduction="sum").item()
            correct += (output.argmax(1) == y).sum().item()
            seen += len(y)
    loss, accuracy = metric_average(loss / seen), metric_average(correct / seen)
    if hvd.rank() == 0:
        print(f"epoch {epoch}: test loss {loss:.4f}, accuracy {100 * accuracy:.1f}%, "
              f"world size {hvd.size()}", flush=True)
    model.train()


@hvd.elastic.run
def train(state):
    for epoch in range(state.epoch, args.epochs):
        state.train_sampler.set_epoch(epoch)
        for batch_idx, (x, y) in enumerate(train_loader):
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
            state.train_sampler.record_batch(batch_idx, args.batch_size)
            if batch_idx % args.batches_per_commit == 0:
                state.commit()
        scheduler.step()
        evaluate(epoch)
        state.epoch = epoch + 1  # committed done: a rollback here does not step the scheduler again
        state.commit()


def on_reset():
    # A new world size: scale the learning rate with it, keeping the scheduler's decay.
    for group, lr in zip(optimizer.param_groups, scheduler.get_last_lr()):
        group["lr"] = lr / scheduler.base_lrs[0] * args.lr * hvd.size()


state = hvd.elastic.TorchState(model=model, optimizer=optimizer, scheduler=scheduler,
                               train_sampler=train_sampler, epoch=0)
state.register_reset_callbacks([on_reset])
train(state)
