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
C one grows an array to any index the file names (LONG_BINPUT 2**32-1 asks for 32 GiB). It runs
under a budget in proportion to the file (loadbudget.py): memory built, work and depth.

Names are looked up without running any module's code: in the tables here, or, to tell a
renamed class from a stranger, in the __dict__ of a module already imported (getattr would run
a module's lazy-import hook: naming torch._dynamo would import it).
"""
import collections
import inspect
import io
import pickle
import struct
import sys

from hvdlite.worker import loadbudget, rebuild
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
    """torch.float32 and the like: values, not classes. Only where torch is imported (a state
    that held one did import it), read from its __dict__: no lazy import of torch._dynamo."""
    torch = sys.modules.get("torch") if module == "torch" else None
    if torch is None:
        return None
    found = vars(torch).get(name)
    return found if isinstance(found, torch.dtype) else None


def _gone(module: str, name: str) -> bool:
    """Whether a module already imported has nothing by that (qualified) name: the edited
    script renamed or removed it. A module not imported is not imported here to find out, and
    nothing is looked up through a module's __getattr__ or a descriptor (getattr_static)."""
    found = sys.modules.get(module)
    if found is None or "__getattr__" in vars(found):  # a lazy name there cannot be told from none
        return False
    for part in name.split("."):
        found = inspect.getattr_static(found, part, None)
        if found is None:
            return True
    return False


def _what(obj) -> str:
    """What an object on the stack is, without calling anything of it (its repr)."""
    return obj.name if isinstance(obj, Constructor) else f"a {type(obj).__name__}"


def _refuse_opcode(what):
    def refuse(self):
        raise Untrusted(f"it holds the opcode {what}, which hvdlite's writer never writes")
    return refuse


class Unpickler(pickle._Unpickler):
    dispatch = dict(pickle._Unpickler.dispatch)

    def __init__(self, file, buffers, budget):
        super().__init__(file, buffers=buffers, fix_imports=False)
        self._unbuilt = {}  # id -> (object a constructor made that awaits its BUILD, its state check)
        self.budget = budget

    def load(self):
        """pickle's own loop, each opcode charged: what it leaves on the stack or in the memo."""
        self._unframer = pickle._Unframer(self._file_read, self._file_readline)
        self.read, self.readinto, self.readline = self._unframer.read, self._unframer.readinto, self._unframer.readline
        self.metastack, self.stack, self.proto = [], [], 0
        self.append = self.stack.append
        read, dispatch, budget, cost, sizeof = self.read, self.dispatch, self.budget, _COST, sys.getsizeof
        try:
            while True:
                key = read(1)
                if not key:
                    raise EOFError
                dispatch[key[0]](self)
                spend = cost[key[0]]
                # inline (the loop's hot path): what loadbudget.size counts of these plain values
                budget.memory_left -= spend if spend >= 0 else 8 + sizeof(self.stack[-1])
                if budget.memory_left < 0:
                    budget.memory(0)
        except pickle._Stop as stop:
            return stop.value

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
        # A constructor may copy its arguments (deque, Counter, a tensor of in-band bytes):
        # what they take must be left before it runs, and what it made is charged.
        self.budget.room(sum(map(loadbudget.size, args)))
        self.budget.arithmetic(*args)
        if func.build is rebuild.counter and args and type(args[0]) is dict:
            self.budget.copying(args[0])
        made = func(*args)
        self.budget.memory(loadbudget.size(made))
        if type(made) is tuple or isinstance(made, tuple):
            self.budget.made_tuple(made)
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
        self.budget.memory(loadbudget.size(self.stack[-1]))
    dispatch[pickle.NEWOBJ[0]] = load_newobj

    def load_newobj_ex(self):
        self.load_newobj(self.stack.pop())
    dispatch[pickle.NEWOBJ_EX[0]] = load_newobj_ex

    def load_build(self):
        target = self.stack[-2]
        unbuilt = self._unbuilt.pop(id(target), None)  # held there, so the id is still target's
        if unbuilt is not None:
            state = self.stack[-1]
            self.budget.room(sum(map(loadbudget.size, state)) if type(state) is tuple else 0)
            unbuilt[1](target, self.stack.pop())
            self.budget.memory(loadbudget.size(target))
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

    def _grown(self, target, before: int) -> None:
        self.budget.memory(max(0, loadbudget.size(target) - before))

    def load_append(self):
        value = self.stack.pop()
        target = self._into(self.stack[-1], _LISTS)
        before = loadbudget.size(target)
        target.append(value)
        self._grown(target, before)
    dispatch[pickle.APPEND[0]] = load_append

    def load_appends(self):
        items = self.pop_mark()
        target = self._into(self.stack[-1], _LISTS)
        before = loadbudget.size(target)
        append = target.append
        for item in items:
            append(item)
        self._grown(target, before)
    dispatch[pickle.APPENDS[0]] = load_appends

    def load_setitem(self):
        value = self.stack.pop()
        key = self.stack.pop()
        target = self._into(self.stack[-1], _DICTS)
        self.budget.hashing((key,), target)
        before = loadbudget.size(target)
        target[key] = value
        self._grown(target, before)
    dispatch[pickle.SETITEM[0]] = load_setitem

    def load_setitems(self):
        items = self.pop_mark()
        target = self._into(self.stack[-1], _DICTS)
        rebuild.need(len(items) % 2 == 0, "it sets a key without a value")
        self.budget.hashing(items[::2], target)
        before = loadbudget.size(target)
        for i in range(0, len(items), 2):
            target[items[i]] = items[i + 1]
        self._grown(target, before)
    dispatch[pickle.SETITEMS[0]] = load_setitems

    def load_additems(self):
        items = self.pop_mark()
        target = self._into(self.stack[-1], (set,))
        self.budget.hashing(items, target)
        before = loadbudget.size(target)
        target.update(items)
        self._grown(target, before)
    dispatch[pickle.ADDITEMS[0]] = load_additems

    # Containers made whole from the stack: charged by the loop (sized), hashed and shaped here.
    def load_dict(self):
        items = self.pop_mark()
        rebuild.need(len(items) % 2 == 0, "it sets a key without a value")
        made = {}
        self.budget.hashing(items[::2], made)  # before: the charge refuses an exponential hash first
        for i in range(0, len(items), 2):
            made[items[i]] = items[i + 1]
        self.append(made)
    dispatch[pickle.DICT[0]] = load_dict

    def load_frozenset(self):
        items = self.pop_mark()
        self.budget.hashing(items)
        self.append(frozenset(items))
        self.budget.made_frozenset(self.stack[-1])
    dispatch[pickle.FROZENSET[0]] = load_frozenset

    def load_tuple(self):
        items = self.pop_mark()
        self.append(tuple(items))
        self.budget.made_tuple(self.stack[-1])
    dispatch[pickle.TUPLE[0]] = load_tuple

    def load_tuple1(self):
        self.stack[-1] = (self.stack[-1],)
        self.budget.made_tuple(self.stack[-1])
    dispatch[pickle.TUPLE1[0]] = load_tuple1

    def load_tuple2(self):
        self.stack[-2:] = [(self.stack[-2], self.stack[-1])]
        self.budget.made_tuple(self.stack[-1])
    dispatch[pickle.TUPLE2[0]] = load_tuple2

    def load_tuple3(self):
        self.stack[-3:] = [(self.stack[-3], self.stack[-2], self.stack[-1])]
        self.budget.made_tuple(self.stack[-1])
    dispatch[pickle.TUPLE3[0]] = load_tuple3

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


def _costs():
    """Bytes each opcode leaves: -1 where the loop sizes what it pushed. Constructors, BUILD and
    items into containers charge themselves."""
    cost = [8] * 256  # a reference on the stack (a memo's get, None, a small int)
    sized = ("BINUNICODE", "BINUNICODE8", "SHORT_BINUNICODE", "UNICODE", "BINBYTES", "BINBYTES8", "SHORT_BINBYTES",
             "BINSTRING", "SHORT_BINSTRING", "STRING", "BINFLOAT", "FLOAT", "BININT", "BININT2", "INT", "LONG",
             "LONG1", "LONG4", "BYTEARRAY8", "EMPTY_LIST", "EMPTY_DICT", "EMPTY_SET", "LIST", "DICT", "FROZENSET",
             "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "READONLY_BUFFER")
    for name in sized:
        cost[getattr(pickle, name)[0]] = -1
    for name in ("PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE"):
        cost[getattr(pickle, name)[0]] = loadbudget.MEMO_ENTRY
    cost[pickle.MARK[0]] = 64  # a new stack (a list) on the metastack
    for name in ("STOP", "POP", "POP_MARK", "PROTO", "FRAME", "REDUCE", "BUILD", "NEWOBJ", "NEWOBJ_EX",
                 "APPEND", "APPENDS", "SETITEM", "SETITEMS", "ADDITEMS"):
        cost[getattr(pickle, name)[0]] = 0
    return cost


_COST = _costs()


def loads(data, buffers, place=True):
    """The object pickled in data, its out-of-band parts from buffers; runs no untrusted code.
    Tensors written from a device go to this process's device of that kind (rebuild.on_device);
    where it has none, or with place=False, they stay on the host (with a line where none)."""
    missing = set()
    token = rebuild.placing.set((place, missing))
    try:
        size = memoryview(data).nbytes + sum(memoryview(b).nbytes for b in buffers)
        state = Unpickler(io.BytesIO(data), buffers, loadbudget.Budget(size)).load()
    finally:
        rebuild.placing.reset(token)
    if missing:
        print(f"hvdlite: the checkpoint holds tensors of {', '.join(sorted(missing))}, a device this "
              f"process does not have: they are loaded onto the CPU", file=sys.stderr, flush=True)
    return state
