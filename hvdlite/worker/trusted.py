"""What a checkpoint file may hold, and the unpickler that enforces it (torch-free).

A pickle can name any importable callable and have it called while loading, and its opcodes
can then change the objects they built; a file in a shared checkpoint folder is not the job's
own word (nothing signs it). So a name in a checkpoint resolves to a Constructor: a function of
hvdlite's own (rebuild.py) that checks its arguments and returns a value, never the class or
function the name is of. Nothing can be set on a class: BUILD (set an object's state) applies
only to an array or dtype a constructor has just made, through its own check, or to an instance
of a class the script passed to `trust()`; items go only into dicts, lists, deques and sets (or
a trusted instance). Anything else ends the load with Untrusted, before it is called.

The unpickler is pickle's Python one with those opcodes replaced: its memo is a dict, where the
C one grows an array to any index the file names (LONG_BINPUT 2**32-1 asks for 32 GiB).
"""
import collections
import io
import pickle
import struct
import sys

from hvdlite.worker import rebuild
from hvdlite.worker.rebuild import Untrusted  # noqa: F401 - part of this module's interface


class Constructor:
    """What a checkpoint's name resolves to: `build(*args)` returns a value. `factory`: the
    type a defaultdict may hold as its factory (plain types only); `new`: a trusted class, for
    NEWOBJ; `state`: how BUILD applies to what `build` returned."""
    __slots__ = ("name", "build", "factory", "new", "state")

    def __init__(self, name, build, factory=None, new=None, state=None):
        self.name, self.build, self.factory, self.new, self.state = name, build, factory, new, state

    def __call__(self, *args):
        return self.build(*args)

    def __repr__(self):
        return f"<checkpoint constructor of {self.name}>"


def _table():
    """(module, name) -> Constructor of every plain value a checkpoint may hold."""
    table = {}

    def add(module, name, build, **more):
        table[module, name] = Constructor(f"{module}.{name}", build, **more)
    for kind in (list, dict, set, frozenset, tuple, int, float, str, bytes, bytearray, bool):
        add("builtins", kind.__name__, rebuild.empty(kind), factory=kind)
    add("builtins", "complex", rebuild.complex_, factory=complex)
    add("builtins", "slice", rebuild.slice_)
    add("builtins", "range", rebuild.range_)
    add("collections", "OrderedDict", rebuild.ordered_dict, factory=collections.OrderedDict)
    add("collections", "defaultdict", rebuild.default_dict)
    add("collections", "deque", rebuild.deque, factory=collections.deque)
    add("collections", "Counter", rebuild.counter, factory=collections.Counter)
    for name, build in rebuild.DATETIME.items():
        add("datetime", name, build)
    add("decimal", "Decimal", rebuild.decimal_)
    add("fractions", "Fraction", rebuild.fraction)
    for core in ("core", "_core"):  # numpy 2 names its modules numpy._core, numpy 1 numpy.core
        add(f"numpy.{core}.multiarray", "_reconstruct", rebuild.reconstruct, state=rebuild.array_state)
        add(f"numpy.{core}.multiarray", "scalar", rebuild.scalar)
        add(f"numpy.{core}.numeric", "_frombuffer", rebuild.frombuffer)
    add("numpy", "ndarray", rebuild.ndarray_marker)
    add("numpy", "dtype", rebuild.dtype, state=rebuild.dtype_state)
    add("hvdlite.worker.rebuild", "tensor", rebuild.tensor)
    add("hvdlite.worker.checkpoints", "_tensor", rebuild.tensor)  # files of hvdlite before rebuild.py
    add("torch._utils", "_rebuild_parameter", rebuild.parameter)
    add("torch", "Size", rebuild.size)
    add("torch", "device", rebuild.device)
    add("hvdlite.worker.rebuild", "on_device", rebuild.on_device)
    return table


PLAIN = _table()
_trusted = {}  # (module, qualified name) -> Constructor of a class a script trusted


def trust(*classes) -> None:
    """Let checkpoints hold instances of these classes (a script's own config objects, say):
    loading one then calls the class's own unpickling code, which the script vouches for.
    Call it before hvd.init(): init already loads the checkpoint it reports to the driver."""
    for cls in classes:
        name = (cls.__module__, cls.__qualname__)
        _trusted[name] = Constructor(".".join(name), cls, new=cls)


def _trusted_instance(obj) -> bool:
    cls = type(obj)
    found = _trusted.get((cls.__module__, cls.__qualname__))
    return found is not None and found.new is cls


def _torch_dtype(module: str, name: str):
    """torch.float32 and the like: values, not classes."""
    if module != "torch":
        return None
    import torch
    found = getattr(torch, name, None)
    return found if isinstance(found, torch.dtype) else None


def _gone(module: str, name: str) -> bool:
    """Whether a module already imported has nothing by that (qualified) name: the edited
    script renamed or removed it. A module not imported is not imported here to find out."""
    found = sys.modules.get(module)
    for part in name.split("."):
        found = getattr(found, part, None)
    return module in sys.modules and found is None


def _what(obj) -> str:
    """What an object on the stack is, without calling anything of it (its repr)."""
    return obj.name if isinstance(obj, Constructor) else f"a {type(obj).__name__}"


def _refuse_opcode(what):
    def refuse(self):
        raise Untrusted(f"it holds the opcode {what}, which hvdlite's writer never writes")
    return refuse


class Unpickler(pickle._Unpickler):
    dispatch = dict(pickle._Unpickler.dispatch)

    def __init__(self, file, buffers):
        super().__init__(file, buffers=buffers, fix_imports=False)
        self._unbuilt = {}  # id -> (object a constructor made that awaits its BUILD, its state check)

    def find_class(self, module, name):
        found = PLAIN.get((module, name)) or _trusted.get((module, name)) or _torch_dtype(module, name)
        if found is not None:
            return found
        if _gone(module, name):
            raise Untrusted(f"it holds {module}.{name}, which the script no longer defines "
                            f"(renamed or removed since the checkpoint was written)")
        raise Untrusted(f"it holds {module}.{name}, which is neither a plain value nor a class "
                        f"the script passed to hvd.elastic.trust() before hvd.init()")

    def persistent_load(self, pid):
        raise Untrusted("it holds a persistent reference, which checkpoints never write")

    def load_reduce(self):
        args = self.stack.pop()
        func = self.stack[-1]
        rebuild.need(isinstance(func, Constructor) and type(args) is tuple, f"it calls {_what(func)}, no constructor")
        made = func(*args)
        if func.state is not None:
            self._unbuilt[id(made)] = (made, func.state)
        self.stack[-1] = made
    dispatch[pickle.REDUCE[0]] = load_reduce

    def load_newobj(self, kwargs=None):
        args = self.stack.pop()
        cls = self.stack.pop()
        rebuild.need(isinstance(cls, Constructor) and cls.new is not None and type(args) is tuple
                     and type(kwargs or {}) is dict, f"it makes an object of {_what(cls)}, no trusted class")
        self.append(cls.new.__new__(cls.new, *args, **(kwargs or {})))
    dispatch[pickle.NEWOBJ[0]] = load_newobj

    def load_newobj_ex(self):
        self.load_newobj(self.stack.pop())
    dispatch[pickle.NEWOBJ_EX[0]] = load_newobj_ex

    def load_build(self):
        target = self.stack[-2]
        unbuilt = self._unbuilt.pop(id(target), None)  # held there, so the id is still target's
        if unbuilt is not None:
            unbuilt[1](target, self.stack.pop())
            return
        if type(target) in _DICTS:  # a state_dict's _metadata: attributes of this one dict
            state = self.stack.pop()
            rebuild.need(type(state) is dict and all(type(k) is str for k in state),
                         f"it sets the state of a {type(target).__name__} to more than attributes")
            target.__dict__.update(state)
            return
        rebuild.need(_trusted_instance(target), f"it sets the state of {type(target).__name__}, which only "
                                                f"trusted classes and fresh arrays take")
        pickle._Unpickler.load_build(self)
    dispatch[pickle.BUILD[0]] = load_build

    def _into(self, target, kinds):
        rebuild.need(type(target) in kinds or _trusted_instance(target),
                     f"it adds items to a {type(target).__name__}, which is no container of them")
        return target

    def load_append(self):
        value = self.stack.pop()
        self._into(self.stack[-1], _LISTS).append(value)
    dispatch[pickle.APPEND[0]] = load_append

    def load_appends(self):
        items = self.pop_mark()
        append = self._into(self.stack[-1], _LISTS).append
        for item in items:
            append(item)
    dispatch[pickle.APPENDS[0]] = load_appends

    def load_setitem(self):
        value = self.stack.pop()
        key = self.stack.pop()
        self._into(self.stack[-1], _DICTS)[key] = value
    dispatch[pickle.SETITEM[0]] = load_setitem

    def load_setitems(self):
        items = self.pop_mark()
        target = self._into(self.stack[-1], _DICTS)
        rebuild.need(len(items) % 2 == 0, "it sets a key without a value")
        for i in range(0, len(items), 2):
            target[items[i]] = items[i + 1]
    dispatch[pickle.SETITEMS[0]] = load_setitems

    def load_additems(self):
        items = self.pop_mark()
        self._into(self.stack[-1], (set,)).update(items)
    dispatch[pickle.ADDITEMS[0]] = load_additems

    def load_bytearray8(self):
        # pickle's own makes a bytearray of the size the file says, then reads into it
        size, = struct.unpack("<Q", self.read(8))
        data = self.read(size)
        rebuild.need(len(data) == size, "it holds a bytearray longer than the file")
        self.append(bytearray(data))
    dispatch[pickle.BYTEARRAY8[0]] = load_bytearray8

    for _op in ("INST", "OBJ", "EXT1", "EXT2", "EXT4"):
        dispatch[getattr(pickle, _op)[0]] = _refuse_opcode(_op)
    del _op


_DICTS = (dict, collections.OrderedDict, collections.defaultdict, collections.Counter)
_LISTS = (list, collections.deque)


def loads(data, buffers, place=True):
    """The object pickled in data, its out-of-band parts from buffers; runs no untrusted code.
    Tensors written from a device go to this process's device of that kind (rebuild.on_device);
    where it has none, or with place=False, they stay on the host (with a line where none)."""
    missing = set()
    token = rebuild.placing.set((place, missing))
    try:
        state = Unpickler(io.BytesIO(data), buffers=buffers).load()
    finally:
        rebuild.placing.reset(token)
    if missing:
        print(f"hvdlite: the checkpoint holds tensors of {', '.join(sorted(missing))}, a device this "
              f"process does not have: they are loaded onto the CPU", file=sys.stderr, flush=True)
    return state
