"""hvdlite's own constructors of the values a checkpoint may hold, each checking its arguments
before it builds anything (torch-free: torch and numpy are imported only by their own).

A pickle calls whatever a name resolves to with arguments from the file, so every constructor
here takes only the forms hvdlite's writer (protocol 5) produces, and sizes only from the bytes
it is given: nothing is built from a number (`bytes(10**12)`), a lazy range is never expanded,
and an array's or tensor's shape must match its data. numpy arrays and dtypes are built through
numpy's public constructors from checked parts: never an object or structured dtype over raw
bytes from the file (their elements would be pointers), never a dtype whose flags the file set.
"""
import collections
import contextvars
import datetime
import decimal
import fractions
import pickle

MAX_DIMS = 32  # numpy's limit is 64; no real state comes near either
PLAIN_KINDS = "biufcSU"  # numpy kinds whose elements are plain bytes: bool, ints, floats, complex, strings


class Untrusted(pickle.UnpicklingError):
    """The file holds something that loading it would have to import, call or build unchecked."""


def need(condition, why: str) -> None:
    if not condition:
        raise Untrusted(why)


def count(shape) -> int:
    """The number of elements of a shape: a tuple of at most MAX_DIMS non-negative ints."""
    need(type(shape) is tuple and len(shape) <= MAX_DIMS and all(type(n) is int and 0 <= n < 1 << 63 for n in shape),
         "it holds an array shape that is no tuple of sizes")
    total = 1
    for n in shape:
        total *= n
    return total


def _buffer(data) -> memoryview:
    need(type(data) in (bytes, bytearray, memoryview, pickle.PickleBuffer), "it holds array data that is no buffer")
    view = memoryview(data)
    need(view.contiguous, "it holds array data that is not contiguous")
    return view


def empty(kind):
    """A constructor of an empty value of a built-in type (a defaultdict's factory)."""
    def build(*args):
        need(not args, f"it builds a {kind.__name__} from arguments, which hvdlite's writer never does")
        return kind()
    return build


def _plain_args(*kinds):
    def check(args):
        need(all(isinstance(a, kinds) for a in args), "it calls a constructor with arguments of the wrong types")
    return check


_numbers = _plain_args(int, float, type(None))


def complex_(*args):
    need(len(args) <= 2, "complex takes two numbers")
    _numbers(args)
    return complex(*args)


def slice_(*args):
    need(len(args) <= 3, "slice takes three numbers")
    _numbers(args)
    return slice(*args)


def range_(*args):
    # Never expanded while loading: no opcode appends a range's items to anything.
    need(1 <= len(args) <= 3 and all(type(a) is int for a in args), "range takes up to three ints")
    return range(*args)


def ordered_dict(*args):
    need(not args, "an OrderedDict's items come by SETITEMS")
    return collections.OrderedDict()


def default_dict(factory=None, *rest):
    need(not rest and (factory is None or getattr(factory, "factory", None) is not None),
         "a defaultdict's factory must be a plain type")
    return collections.defaultdict(None if factory is None else factory.factory)


def deque(items=(), maxlen=None, *rest):
    need(not rest and type(items) in (tuple, list) and (maxlen is None or type(maxlen) is int),
         "a deque takes a tuple of items and a maximum length")
    return collections.deque(items, maxlen)


def counter(counts=None, *rest):
    need(not rest and (counts is None or type(counts) is dict), "a Counter takes a dict")
    return collections.Counter(counts or {})


def _time_values(kind):
    check = _plain_args(int, float, bytes, str, datetime.timedelta, datetime.timezone, type(None))

    def build(*args):
        check(args)  # the C constructors check the values themselves, bytes states included
        return kind(*args)
    return build


DATETIME = {name: _time_values(getattr(datetime, name))
            for name in ("datetime", "date", "time", "timedelta", "timezone")}


def decimal_(value="0", *rest):
    need(not rest and type(value) in (str, int, float, tuple), "a Decimal takes a string")
    return decimal.Decimal(value)


def fraction(numerator=0, denominator=1, *rest):
    # Only ints: Fraction('1e999999999') and Fraction(Decimal(...)) compute 10**exponent.
    need(not rest and type(numerator) is int and type(denominator) is int, "a Fraction takes two ints")
    return fractions.Fraction(numerator, denominator)


# ---- numpy ------------------------------------------------------------------------------
def ndarray_marker(*args):
    raise Untrusted("it calls numpy.ndarray, which checkpoints only name for _reconstruct")


def dtype(code, align=False, copy=True, *rest):
    import numpy
    # copy: numpy's own dtypes are shared by the whole process; BUILD below goes to a copy only
    need(not rest and type(code) is str and len(code) <= 16 and type(align) is bool and copy is True,
         "a numpy dtype takes a type code, copied")
    found = numpy.dtype(code, align, copy)
    need(found.names is None and found.subdtype is None and found.kind in PLAIN_KINDS + "O" and found.itemsize > 0,
         f"it holds the numpy dtype {code!r}: checkpoints hold plain and object dtypes, not structured, "
         f"void or datetime ones")
    return found


def dtype_state(found, state) -> None:
    """BUILD on a dtype `dtype` made: its byte order only, its flags numpy's own."""
    need(type(state) is tuple and len(state) == 8 and state[0] == 3, "it holds a numpy dtype state of another form")
    _, order, sub, names, fields, size, align, flags = state
    orders = ("|",) if found.byteorder == "|" else ("<", ">", "=")
    need(order in orders and sub is None and names is None and fields is None
         and type(size) is int and size in (-1, found.itemsize) and type(align) is int
         and align in (-1, found.alignment) and type(flags) is int and flags == found.flags,
         "it holds a numpy dtype state that changes more than the byte order")
    found.__setstate__((3, order, None, None, None, size, align, found.flags))


def reconstruct(subtype, shape, code, *rest):
    import numpy
    need(not rest and getattr(subtype, "build", None) is ndarray_marker and shape == (0,) and code == b"b",
         "it calls numpy's _reconstruct with arguments of another form")
    return numpy.ndarray((0,), "b")


def array_state(array, state) -> None:
    """BUILD on an array `reconstruct` made: object elements only as a list of values, plain
    elements only as bytes of the shape's size."""
    import numpy
    need(type(state) is tuple and len(state) == 5 and state[0] == 1, "it holds a numpy array state of another form")
    _, shape, found, fortran, data = state
    n = count(shape)
    need(isinstance(found, numpy.dtype) and type(fortran) is bool, "it holds a numpy array state of another form")
    if found.kind == "O":
        need(type(data) is list and len(data) == n, "it holds an object array whose elements are not a list of values")
    else:
        need(found.kind in PLAIN_KINDS and type(data) in (bytes, bytearray) and len(data) == n * found.itemsize,
             "it holds an array whose data does not match its shape")
    array.__setstate__((1, shape, found, fortran, data))


def frombuffer(buffer, found, shape, order, *rest):
    import numpy
    need(not rest and isinstance(found, numpy.dtype) and found.kind in PLAIN_KINDS and order in ("C", "F"),
         "it holds an array of raw bytes that is not of a plain dtype")
    view, n = _buffer(buffer), count(shape)
    need(view.nbytes == n * found.itemsize, "it holds an array whose data does not match its shape")
    if n == 0:
        return numpy.empty(shape, found, order=order)
    return numpy.frombuffer(buffer, found).reshape(shape, order=order)


def scalar(found, data, *rest):
    import numpy
    need(not rest and isinstance(found, numpy.dtype) and found.kind in PLAIN_KINDS and type(data) is bytes
         and len(data) == found.itemsize, "it holds a numpy scalar that is not of a plain dtype")
    return numpy.frombuffer(data, found, count=1)[0]



# ---- torch ------------------------------------------------------------------------------
def tensor(dtype: str, shape: tuple, requires_grad: bool, data):
    """A dense CPU tensor from its raw bytes (written out of band by checkpoints._Pickler)."""
    import torch
    kind = vars(torch).get(dtype) if type(dtype) is str else None  # no lazy import (getattr would)
    need(isinstance(kind, torch.dtype),
         f"it holds a tensor of the unknown dtype {dtype[:40] if type(dtype) is str else type(dtype).__name__!r}")
    view, n = _buffer(data), count(shape)
    need(type(requires_grad) is bool and view.nbytes == n * kind.itemsize,
         "it holds a tensor whose data does not match its shape")
    if n == 0:
        return torch.empty(shape, dtype=kind).requires_grad_(requires_grad)
    if view.readonly:  # torch warns on a read-only buffer
        data = bytearray(view)
    raw = torch.frombuffer(data, dtype=torch.uint8)
    need(kind is not torch.bool or int(raw.max()) <= 1, "it holds a bool tensor with bytes other than 0 and 1")
    return raw.view(kind).reshape(shape).requires_grad_(requires_grad)


# How the load in progress places tensors written from a device: (place them, the devices this
# process had none of). The writer's own check of a state leaves them on the host.
placing = contextvars.ContextVar("hvdlite_placing", default=(True, set()))


def on_device(tensor, device):
    """A tensor written from `device` (a GPU's, say), on this process's device of that kind:
    the GPU its slot uses (gpus.py); on the host where it has none, noted in `placing`."""
    import torch
    need(isinstance(tensor, torch.Tensor) and type(device) is str and len(device) <= 40,
         "it holds a tensor on a device that is no device name")
    try:
        kind = torch.device(device).type
    except RuntimeError:
        raise Untrusted(f"it holds a tensor on the unknown device {device!r}") from None
    place, missing = placing.get()
    here = _slot_device(kind) if place else None
    if here is None:
        if place:
            missing.add(device)
        return tensor
    return tensor.detach().to(here).requires_grad_(tensor.requires_grad)


def _slot_device(kind: str):
    """This process's device of `kind` for its slot, or None where it has none."""
    import torch
    from hvdlite.worker import gpus
    module = vars(torch).get(kind)
    if kind == "cpu" or not getattr(module, "is_available", lambda: False)():
        return None
    count = getattr(module, "device_count", lambda: 1)()
    return torch.device(kind, gpus.slot_index(count))


def parameter(data, requires_grad, hooks, *rest):
    import torch
    need(not rest and isinstance(data, torch.Tensor) and type(requires_grad) is bool
         and type(hooks) in (dict, collections.OrderedDict) and not hooks,
         "it holds a torch Parameter of another form (hooks, or no tensor)")
    return torch.nn.Parameter(data, requires_grad)


def size(dims=(), *rest):
    import torch
    need(not rest and type(dims) is tuple and all(type(n) is int for n in dims), "a torch.Size takes a tuple of ints")
    return torch.Size(dims)


def device(*args):
    import torch
    need(1 <= len(args) <= 2 and type(args[0]) in (str, int) and all(type(a) is int for a in args[1:]),
         "a torch.device takes a name and an index")
    return torch.device(*args)
