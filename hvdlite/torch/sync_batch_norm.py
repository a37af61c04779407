"""SyncBatchNorm: batch normalization over the whole world's batch, as Horovod's."""
import torch
from torch.nn.modules.batchnorm import _BatchNorm

from hvdlite.torch import ops


class SyncBatchNorm(_BatchNorm):
    """In training, normalizes with the mean and variance of every rank's batch together (its
    output and running statistics are those of one BatchNorm over the concatenated batch);
    in evaluation, with the running statistics, as BatchNorm."""

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input):
        self._check_input_dim(input)
        if not (self.training or not self.track_running_stats):
            return super().forward(input)
        factor = 0.0
        if self.training and self.track_running_stats:
            self.num_batches_tracked.add_(1)
            factor = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
        return _SyncBatchNorm.apply(input, self.weight, self.bias, self.running_mean,
                                    self.running_var, self.eps, factor)


def _per_channel(x):
    """x of shape (N, C, ...) as (C, N * ...)."""
    return x.transpose(0, 1).reshape(x.shape[1], -1)


def _shape(x, like):
    return x.view((1, -1) + (1,) * (like.dim() - 2))


class _SyncBatchNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, eps, factor):
        flat = _per_channel(x.detach()).double()
        count = torch.tensor([float(flat.shape[1])], dtype=torch.float64)
        total, squares, count = ops.grouped_allreduce_async(
            [flat.sum(1), (flat * flat).sum(1), count], op=ops.Sum).wait()
        n = count.item()
        mean = total / n
        var = squares / n - mean * mean  # biased, as normalization uses
        if running_mean is not None and factor:
            running_mean.mul_(1 - factor).add_(mean.to(running_mean.dtype), alpha=factor)
            unbiased = var * n / max(n - 1, 1)
            running_var.mul_(1 - factor).add_(unbiased.to(running_var.dtype), alpha=factor)
        invstd = (var + eps).rsqrt()
        xhat = (x.detach() - _shape(mean, x).to(x.dtype)) * _shape(invstd, x).to(x.dtype)
        ctx.save_for_backward(xhat, weight, invstd.to(x.dtype))
        ctx.n = n
        out = xhat
        if weight is not None:
            out = out * _shape(weight.detach(), x) + _shape(bias.detach(), x)
        return out

    @staticmethod
    def backward(ctx, dy):
        xhat, weight, invstd = ctx.saved_tensors
        dy_flat, xhat_flat = _per_channel(dy), _per_channel(xhat)
        local_dy, local_dy_xhat = dy_flat.sum(1), (dy_flat * xhat_flat).sum(1)
        # The gradient of x needs these sums over the whole batch; the weight's and bias's
        # are local, averaged across ranks by the optimizer as every other gradient.
        sum_dy, sum_dy_xhat = ops.grouped_allreduce_async([local_dy, local_dy_xhat], op=ops.Sum).wait()
        scale = invstd if weight is None else invstd * weight.detach()
        dx = _shape(scale, dy) * (dy - _shape(sum_dy / ctx.n, dy) - xhat * _shape(sum_dy_xhat / ctx.n, dy))
        grad_weight = local_dy_xhat if weight is not None and ctx.needs_input_grad[1] else None
        grad_bias = local_dy if weight is not None and ctx.needs_input_grad[2] else None
        return dx, grad_weight, grad_bias, None, None, None, None
