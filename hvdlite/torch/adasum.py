"""Adasum arithmetic (pure): combines gradients so that parallel components add and
orthogonal ones are kept, as Horovod's Adasum does."""
import torch

_TINY = 1e-8  # below this squared norm a vector counts as zero, as in Horovod


def combine(a, b):
    """(1 - a.b / 2|a|^2) a + (1 - a.b / 2|b|^2) b, with the dot products in float64."""
    a64, b64 = a.double().reshape(-1), b.double().reshape(-1)
    dot, a_sq, b_sq = torch.dot(a64, b64), torch.dot(a64, a64), torch.dot(b64, b64)
    a_coeff = 1.0 - dot / a_sq * 0.5 if a_sq >= _TINY else 1.0
    b_coeff = 1.0 - dot / b_sq * 0.5 if b_sq >= _TINY else 1.0
    return (a64 * a_coeff + b64 * b_coeff).to(a.dtype).view(a.shape)


def reduce(parts):
    """Adasum of the ranks' tensors (in rank order) over a binary tree: neighbours first,
    then pairs of pairs, as Horovod's recursive halving; a rank without a partner at some
    level passes its value up unchanged."""
    parts = list(parts)
    distance = 1
    while distance < len(parts):
        for i in range(0, len(parts) - distance, 2 * distance):
            parts[i] = combine(parts[i], parts[i + distance])
        distance *= 2
    return parts[0]
