"""hvdlite: Horovod-style elastic distributed training on torch.distributed gloo."""
__version__ = "0.1.0"
