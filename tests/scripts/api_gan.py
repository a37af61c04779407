"""Two models, two optimizers and a scheduler trained in lockstep; shared by the TorchState job
(tests/scripts/api_state_job.py) and the test that replays it on one process."""
import warnings

import torch

GLOBAL_BATCH = 12  # divisible by 1, 2, 3 and 4: every world averages equal shards


def build(seed, wrap=lambda opt, model: opt):
    torch.manual_seed(seed)
    gen = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Tanh(), torch.nn.Linear(6, 3))
    disc = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.LayerNorm(5), torch.nn.Linear(5, 1))
    opt_g = wrap(torch.optim.Adam(gen.parameters(), lr=0.01), gen)
    opt_d = wrap(torch.optim.SGD(disc.parameters(), lr=0.1, momentum=0.9), disc)
    sched = torch.optim.lr_scheduler.StepLR(opt_d, step_size=3, gamma=0.8)
    return gen, disc, opt_g, opt_d, sched


def data(step, rank=0, size=1):
    g = torch.Generator().manual_seed(1000 + step)
    x, y, z = torch.randn(GLOBAL_BATCH, 4, generator=g), torch.randn(GLOBAL_BATCH, 3, generator=g), \
        torch.randn(GLOBAL_BATCH, 1, generator=g)
    n = GLOBAL_BATCH // size
    return x[rank * n:(rank + 1) * n], y[rank * n:(rank + 1) * n], z[rank * n:(rank + 1) * n]


def step_generator(gen, opt_g, x, y):
    opt_g.zero_grad()
    torch.nn.functional.mse_loss(gen(x), y).backward()
    opt_g.step()


def step_discriminator(gen, disc, opt_d, x, z):
    opt_d.zero_grad()
    torch.nn.functional.mse_loss(disc(gen(x).detach()), z).backward()
    opt_d.step()


def flat(*objects):
    """Parameters and buffers of models, and the tensors and lr of optimizers, as one vector."""
    parts = []
    for obj in objects:
        if isinstance(obj, torch.nn.Module):
            parts += [t.detach().double().flatten() for _, t in sorted(obj.state_dict().items())]
        else:
            parts += [torch.tensor([g["lr"] for g in obj.param_groups], dtype=torch.float64)]
            parts += [t.double().flatten() for s in obj.state.values() for t in s.values()
                      if isinstance(t, torch.Tensor)]
    return torch.cat(parts)


def replay(steps):
    """What one process holds after `steps` steps on the whole batch (rank 0's initial state:
    seed 1)."""
    gen, disc, opt_g, opt_d, sched = build(1)
    for step in range(steps):
        x, y, z = data(step)
        step_generator(gen, opt_g, x, y)
        with warnings.catch_warnings():  # stepped before opt_d on purpose, as in the job
            warnings.simplefilter("ignore")
            sched.step()
        step_discriminator(gen, disc, opt_d, x, z)
    return flat(gen, disc, opt_g, opt_d)
