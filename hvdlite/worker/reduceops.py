"""Horovod's reduction ops, shared by every backend (torch-free).

The values are Horovod's, so scripts that store or compare them behave the same.
"""
Average, Sum, Adasum, Min, Max, Product = 0, 1, 2, 3, 4, 5


def resolve(op, average) -> int:
    """The op a call asks for, from `op` or the legacy `average` flag; Average by default."""
    if op is not None and average is not None:
        raise ValueError("give either op or the legacy average flag, not both")
    if op is None:
        op = Average if average is None or average else Sum
    if op not in (Average, Sum, Adasum, Min, Max, Product):
        raise ValueError(f"unknown reduction op {op!r}")
    return op


def shares(rows, size) -> list:
    """Rows of each rank in a reducescatter: as even as possible, the first ranks one more."""
    return [rows // size + (1 if r < rows % size else 0) for r in range(size)]
