"""Gradient compression around allreduce, with Horovod's Compressor interface."""
import torch


class Compressor:
    """compress(tensor) -> (tensor, ctx) before the allreduce; decompress(tensor, ctx) after."""

    @staticmethod
    def compress(tensor):
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx):
        raise NotImplementedError


class NoneCompressor(Compressor):
    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class FP16Compressor(Compressor):
    """Sends floating point tensors as float16, halving the bytes on the wire."""

    @staticmethod
    def compress(tensor):
        if tensor.is_floating_point():
            return tensor.to(torch.float16), tensor.dtype
        return tensor, None  # integers are exact already; leave them alone

    @staticmethod
    def decompress(tensor, ctx):
        return tensor if ctx is None else tensor.to(ctx)


class Compression:
    none = NoneCompressor
    fp16 = FP16Compressor
