"""A Store in etcd v3, spoken through its JSON gateway (HTTP POST, base64 keys and values).

Keys, under the job's prefix:
  epoch          the newest lease's epoch, a decimal counter: the fencing token
  leader         {"owner", "epoch"} of the live lease, attached to an etcd lease of its ttl, so
                 etcd deletes it when the holder stops renewing (process or host lost)
  journal/KEY    the values drivers put

A lease is granted by one transaction that creates `leader` only while it is absent and moves
`epoch` on only from the value just read; a put is a transaction that writes only while `epoch`
still holds the caller's epoch. Both are decided by etcd's leader on a majority of members,
so a driver cut off from the majority can neither take a lease nor write, and once it can
reach them again a newer epoch refuses it. As in FileStore, a lease that expired while nobody
took a newer one is still the newest: its holder may renew it and write.

Every request has a timeout and goes to the members in turn, starting from the last one that
answered: a member down or cut off is skipped. Reads are linearizable (etcd's default), so a
member in a minority answers nothing rather than something stale.
"""
import base64
import itertools
import json
import math
import time
import urllib.error
import urllib.request
from typing import Optional

from hvdlite.driver.store import Fenced, Lease, Store

SCHEME = "etcd://"


class Unreachable(OSError):
    """No member of the etcd cluster answered: the lease can be neither confirmed nor taken."""


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _value(kv: dict) -> bytes:
    return base64.b64decode(kv.get("value", ""))


def parse(url: str):
    """`etcd://h1:2379,h2/PREFIX` -> (['http://h1:2379', 'http://h2:2379'], '/PREFIX'): the
    members (port 2379 when left out) and the keys' prefix, None when the URL names none.
    ValueError for anything else."""
    if not url.startswith(SCHEME):
        raise ValueError(f"expected {SCHEME}HOST[:PORT][,HOST[:PORT]...][/PREFIX], got {url!r}")
    members, slash, prefix = url[len(SCHEME):].partition("/")
    out = []
    for member in members.split(","):
        host, _, port = member.strip().rpartition(":") if ":" in member else (member.strip(), "", "2379")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{url!r}: {member!r} is not HOST[:PORT]")
        out.append(f"http://{host}:{port}")
    return out, ("/" + prefix.strip("/") if prefix.strip("/") else None)


class EtcdStore(Store):
    def __init__(self, url: str, prefix: str = None, timeout: float = 2.0):
        """The members of `url` (parse); the job's keys under the URL's prefix, else `prefix`."""
        self.members, named = parse(url)
        self.prefix = (named or prefix).rstrip("/") + "/"
        self.timeout = timeout
        self._next = 0  # the member that answered last: asked first

    # ---- the gateway ------------------------------------------------------------------
    def _call(self, path: str, body: dict) -> dict:
        """POST `body` to the members in turn, from the last that answered, until one answers
        or `timeout` x members have passed (an election after a member's loss takes about a
        second, during which members answer nothing); a member down, cut off or without a
        leader (HTTP 5xx) is skipped. etcd's refusals (4xx) raise LookupError."""
        data = json.dumps(body).encode()
        deadline = time.monotonic() + self.timeout * len(self.members)
        errors = {}
        for attempt in itertools.count():
            member = self.members[(self._next + attempt) % len(self.members)]
            left = deadline - time.monotonic()
            if left <= 0:
                break
            if attempt and attempt % len(self.members) == 0:
                time.sleep(min(0.05, left))  # every member refused at once: no busy loop
            request = urllib.request.Request(member + path, data=data, method="POST",
                                             headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=min(self.timeout, left)) as answer:
                    text = answer.read()
            except urllib.error.HTTPError as e:
                if e.code < 500:  # etcd's refusal, e.g. a lease it no longer has
                    raise LookupError(f"{member}: HTTP {e.code} {e.read()[:200]!r}") from None
                errors[member] = f"HTTP {e.code}"
                continue
            except (OSError, ValueError) as e:  # refused, timed out, reset, unreachable
                errors[member] = str(getattr(e, "reason", e))
                continue
            self._next = self.members.index(member)
            answer = json.loads(text)
            return answer.get("result", answer)  # a stream's one message comes as {"result": ...}
        raise Unreachable("no etcd member answered: " + "; ".join(f"{m}: {e}" for m, e in errors.items()))

    def _range(self, name: str) -> Optional[dict]:
        kvs = self._call("/v3/kv/range", {"key": _b64(self.prefix + name)}).get("kvs")
        return kvs[0] if kvs else None

    def _read_lease(self):
        """(the leader key's kv or None, the epoch counter's value) in one linearizable read."""
        both = self._call("/v3/kv/txn", {"success": [
            {"request_range": {"key": _b64(self.prefix + "leader")}},
            {"request_range": {"key": _b64(self.prefix + "epoch")}}]})["responses"]
        leader, epoch = (r["response_range"].get("kvs", [None])[0] for r in both)
        return leader, int(_value(epoch)) if epoch else 0

    def _grant(self, ttl: float) -> str:
        return self._call("/v3/lease/grant", {"TTL": max(1, math.ceil(ttl))})["ID"]

    def _revoke(self, lease_id: str) -> None:
        try:
            self._call("/v3/lease/revoke", {"ID": lease_id})
        except LookupError:  # expired already
            pass

    def _attach(self, lease: Lease, ttl: float) -> bool:
        """`leader` written anew for `lease` under a fresh etcd lease, while `epoch` still holds
        lease.epoch (then nobody took a lease since: a leader key there is this lease's)."""
        lease_id = self._grant(ttl)
        value = json.dumps({"owner": lease.owner, "epoch": lease.epoch})
        answer = self._call("/v3/kv/txn", {
            "compare": [self._epoch_is(lease.epoch)],
            "success": [{"request_put": {"key": _b64(self.prefix + "leader"), "value": _b64(value),
                                         "lease": lease_id}}]})
        if not answer.get("succeeded"):
            self._revoke(lease_id)
        return bool(answer.get("succeeded"))

    def _epoch_is(self, epoch: int) -> dict:
        if epoch == 0:  # etcd fails every value comparison with a missing key
            return {"key": _b64(self.prefix + "epoch"), "target": "CREATE", "result": "EQUAL",
                    "create_revision": "0"}
        return {"key": _b64(self.prefix + "epoch"), "target": "VALUE", "result": "EQUAL",
                "value": _b64(str(epoch))}

    # ---- the Store ----------------------------------------------------------------------
    def acquire(self, owner, ttl):
        leader, epoch = self._read_lease()
        if leader is not None:
            return None
        lease_id = self._grant(ttl)
        lease = Lease(owner, epoch + 1)
        leader_key, epoch_key = _b64(self.prefix + "leader"), _b64(self.prefix + "epoch")
        value = _b64(json.dumps({"owner": owner, "epoch": lease.epoch}))
        answer = self._call("/v3/kv/txn", {
            "compare": [
                {"key": leader_key, "target": "CREATE", "result": "EQUAL", "create_revision": "0"},
                self._epoch_is(epoch)],
            "success": [{"request_put": {"key": leader_key, "value": value, "lease": lease_id}},
                        {"request_put": {"key": epoch_key, "value": _b64(str(lease.epoch))}}],
            "failure": [{"request_range": {"key": leader_key}}]})
        if answer.get("succeeded"):
            return lease
        kvs = answer["responses"][0]["response_range"].get("kvs")
        if kvs and kvs[0].get("lease") == lease_id:
            return lease  # this transaction was applied by a member that then did not answer
        self._revoke(lease_id)
        return None  # another driver took it meanwhile (or released one: the next poll sees)

    def renew(self, lease, ttl):
        # etcd keeps the ttl of the grant: a renewal restarts it (drivers renew with one ttl)
        leader, epoch = self._read_lease()
        if epoch != lease.epoch:
            return False
        if leader is not None:
            try:
                if int(self._call("/v3/lease/keepalive", {"ID": leader["lease"]}).get("TTL", 0)) > 0:
                    return True
            except LookupError:
                pass
        return self._attach(lease, ttl)  # expired, and nobody took a lease since

    def release(self, lease):
        leader, _ = self._read_lease()
        if leader is not None and json.loads(_value(leader))["epoch"] == lease.epoch:
            self._revoke(leader["lease"])  # deletes the leader key; the epoch stays

    def holder(self):
        leader = self._range("leader")
        if leader is None:
            return None
        held = json.loads(_value(leader))
        return Lease(held["owner"], held["epoch"])

    def put(self, lease, key, value):
        answer = self._call("/v3/kv/txn", {
            "compare": [self._epoch_is(lease.epoch)],
            "success": [{"request_put": {"key": _b64(self.prefix + "journal/" + key),
                                         "value": base64.b64encode(value).decode()}}]})
        if not answer.get("succeeded"):
            raise Fenced(f"lease {lease.epoch} of {lease.owner} was superseded")

    def get(self, key):
        kv = self._range("journal/" + key)
        return None if kv is None else _value(kv)
