"""How every backend turns Python objects into bytes for its collectives (torch-free).

Unpickling runs code, so every pickle is signed with the job's key (derived from the job's
secret, claim.job_secret) and checked before it is loaded: a peer or a store write without
the key cannot make a worker run anything.
"""
import hashlib
import hmac
import os

import cloudpickle

from hvdlite.worker.claim import job_secret

MAC_SIZE = 32


class ForgedObject(ValueError):
    """The bytes were not signed with this job's key."""


def key_for(secret: str) -> bytes:
    # Its own key, so a signed object can never pass for a signed KV request.
    return hmac.new(secret.encode("utf-8"), b"hvdlite pickled objects", hashlib.sha256).digest()


def _job_key() -> bytes:
    return key_for(job_secret(os.environ))


def dumps(obj, key: bytes = None) -> bytes:
    data = cloudpickle.dumps(obj)
    return hmac.digest(key or _job_key(), data, "sha256") + data


def loads(buffer, key: bytes = None):
    """The object in `buffer` (bytes or anything with the buffer protocol, e.g. a uint8 array),
    once its signature checks out; ForgedObject if it does not."""
    view = memoryview(buffer).cast("B")
    data = view[MAC_SIZE:]
    if len(view) < MAC_SIZE or not hmac.compare_digest(
            bytes(view[:MAC_SIZE]), hmac.digest(key or _job_key(), data, "sha256")):
        raise ForgedObject("hvdlite: refusing to unpickle an object not signed with this job's key")
    return cloudpickle.loads(data)
