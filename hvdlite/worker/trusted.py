"""What a checkpoint file may hold, and the unpickler that enforces it (torch-free).

A pickle can name any importable callable and have it called while loading; a file in a
shared checkpoint folder is not the job's own word (nothing signs it). So loading a
checkpoint resolves only the names listed here: plain value types, the constructors of numpy
arrays and scalars, hvdlite's own tensor rebuilder, torch's parameter rebuilder, dtypes,
devices and sizes, and the classes a script hands to `trust()`. Anything else ends the load
with Untrusted, before it is called.
"""
import io
import pickle
import sys

# (module, name) pairs that rebuild plain values and call nothing else.
PLAIN = frozenset(
    [("builtins", name) for name in ("list", "dict", "set", "frozenset", "tuple", "int", "float",
                                     "complex", "str", "bytes", "bytearray", "bool", "slice", "range")]
    + [("collections", name) for name in ("OrderedDict", "defaultdict", "deque", "Counter")]
    + [("datetime", name) for name in ("datetime", "date", "time", "timedelta", "timezone")]
    + [("decimal", "Decimal"), ("fractions", "Fraction")]
    # numpy 2 names its modules numpy._core, numpy 1 numpy.core
    + [(f"numpy.{core}.{module}", name) for core in ("core", "_core")
       for module, name in (("multiarray", "_reconstruct"), ("multiarray", "scalar"),
                            ("numeric", "_frombuffer"))]
    + [("numpy", "ndarray"), ("numpy", "dtype")]
    + [("hvdlite.worker.checkpoints", "_tensor"), ("torch._utils", "_rebuild_parameter"),
       ("torch", "Size"), ("torch", "device")])

_trusted = set()  # (module, qualified name) of classes scripts trusted


class Untrusted(pickle.UnpicklingError):
    """The file names something that loading it would have to import and call."""


def trust(*classes) -> None:
    """Let checkpoints hold instances of these classes (a script's own config objects, say):
    loading one then calls the class's own unpickling code, which the script vouches for.
    Call it before hvd.init(): init already loads the checkpoint it reports to the driver."""
    for cls in classes:
        _trusted.add((cls.__module__, cls.__qualname__))


def _torch_dtype(module: str, name: str) -> bool:
    if module != "torch":
        return False
    import torch
    return isinstance(getattr(torch, name, None), torch.dtype)


def _gone(module: str, name: str) -> bool:
    """Whether a module already imported has nothing by that (qualified) name: the edited
    script renamed or removed it. A module not imported is not imported here to find out."""
    found = sys.modules.get(module)
    for part in name.split("."):
        found = getattr(found, part, None)
    return module in sys.modules and found is None


class Unpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if (module, name) in PLAIN or (module, name) in _trusted or _torch_dtype(module, name):
            return super().find_class(module, name)
        if _gone(module, name):
            raise Untrusted(f"it holds {module}.{name}, which the script no longer defines "
                            f"(renamed or removed since the checkpoint was written)")
        raise Untrusted(f"it holds {module}.{name}, which is neither a plain value nor a class "
                        f"the script passed to hvd.elastic.trust() before hvd.init()")

    def persistent_load(self, pid):
        raise Untrusted("it holds a persistent reference, which checkpoints never write")


def loads(data, buffers):
    """The object pickled in data, its out-of-band parts from buffers; runs no untrusted code."""
    return Unpickler(io.BytesIO(data), buffers=buffers).load()
