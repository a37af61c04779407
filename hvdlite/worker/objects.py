"""How every backend turns Python objects into bytes for its collectives (torch-free)."""
import cloudpickle


def dumps(obj) -> bytes:
    return cloudpickle.dumps(obj)


def loads(buffer):
    """The object in `buffer` (bytes or anything with the buffer protocol, e.g. a uint8 array)."""
    return cloudpickle.loads(memoryview(buffer))
