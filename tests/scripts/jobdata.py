"""The data of the test training job: a pure function of the dataset row index."""
import torch


def batch(indices):
    x = torch.stack([torch.sin(torch.arange(4.0) * (i + 1)) for i in indices])
    return x, x.sum(dim=1, keepdim=True) * 0.5
