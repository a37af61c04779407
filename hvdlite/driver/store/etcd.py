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

`etcds://` members speak TLS. What to trust and who this driver is come from etcdctl's own
variables, so a shell set up for `etcdctl` is set up for the driver: ETCDCTL_CACERT (the CA;
default: the system's), ETCDCTL_CERT and ETCDCTL_KEY (a client certificate, for etcd's
--client-cert-auth), ETCDCTL_USER and ETCDCTL_PASSWORD (or ETCDCTL_USER=NAME:PASSWORD), the
user whose token (/v3/auth/authenticate) goes with every request. A token etcd no longer
knows (it expired: etcd's --auth-token-ttl) is replaced and the request sent again. What etcd
refuses for good (a certificate that does not verify, a wrong password, a permission missing)
raises Refused: waiting would not help.
"""
import base64
import itertools
import json
import math
import os
import ssl
import time
import urllib.error
import urllib.request
from typing import Optional

from hvdlite.driver.store import Fenced, Lease, Store
from hvdlite.errors import JobError

SCHEMES = {"etcd://": "http://", "etcds://": "https://"}
# etcdctl's variables (etcdctl --help: each flag's ETCDCTL_ variable); workers are not given
# the two that may hold a password (workerenv.py).
CACERT, CERT, KEY, USER, PASSWORD = "ETCDCTL_CACERT", "ETCDCTL_CERT", "ETCDCTL_KEY", "ETCDCTL_USER", "ETCDCTL_PASSWORD"
SECRET = (USER, PASSWORD)
# etcd's answers (its rpctypes errors, through the gateway): a token to replace, and what is
# refused for good (etcd 3.4's gateway refuses a client certificate with a CommonName once
# auth is on, CVE-2018-16886: the CN would otherwise be taken for a user name).
EXPIRED = ("etcdserver: invalid auth token", "etcdserver: revision of auth store is old")
NOT_ENABLED = "etcdserver: authentication is not enabled"
REFUSED = ("etcdserver: permission denied", "etcdserver: user name is empty",
           "etcdserver: authentication failed, invalid user ID or password",
           "CommonName of client sending a request against gateway")


class Unreachable(JobError, OSError):
    """No member of the etcd cluster answered: the lease can be neither confirmed nor taken. A
    standby waits it out (an OSError); a driver starting ends on it (a JobError: one line)."""


class Refused(JobError):
    """etcd refuses this driver: its certificate, CA, user or permissions are wrong."""


class _Expired(Exception):
    """The token sent is no longer valid: authenticate again."""


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _value(kv: dict) -> bytes:
    return base64.b64decode(kv.get("value", ""))


def parse(url: str):
    """`etcd://h1:2379,h2/PREFIX` -> (['http://h1:2379', 'http://h2:2379'], '/PREFIX'): the
    members (port 2379 when left out; https:// for etcds://) and the keys' prefix, None when
    the URL names none. ValueError for anything else."""
    scheme = next((s for s in SCHEMES if url.startswith(s)), None)
    if scheme is None:
        raise ValueError(f"expected etcd://HOST[:PORT][,HOST[:PORT]...][/PREFIX] (etcds:// for TLS), got {url!r}")
    members, slash, prefix = url[len(scheme):].partition("/")
    out = []
    for member in members.split(","):
        host, _, port = member.strip().rpartition(":") if ":" in member else (member.strip(), "", "2379")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{url!r}: {member!r} is not HOST[:PORT]")
        out.append(f"{SCHEMES[scheme]}{host}:{port}")
    return out, ("/" + prefix.strip("/") if prefix.strip("/") else None)


def _tls(env, secure: bool):
    """The TLS context for https members from etcdctl's variables in `env`, None for http
    ones; ValueError naming the variable whose file does not load."""
    given = {name: env[name] for name in (CACERT, CERT, KEY) if env.get(name)}
    if not secure:
        if given:
            raise ValueError(f"{next(iter(given))} is set, but etcd:// members speak plain HTTP: name them etcds://")
        return None
    if KEY in given and CERT not in given:
        raise ValueError(f"{KEY} is set without {CERT}")
    try:
        context = ssl.create_default_context(cafile=given.get(CACERT))
    except (OSError, ssl.SSLError) as e:
        raise ValueError(f"{CACERT}={given[CACERT]}: not a readable CA certificate ({_reason(e)})") from None
    if CERT in given:
        try:  # an encrypted key is refused, never prompted for
            context.load_cert_chain(given[CERT], given.get(KEY), password=lambda: b"")
        except (OSError, ssl.SSLError) as e:
            files = " and ".join(f"{name}={given[name]}" for name in (CERT, KEY) if name in given)
            raise ValueError(f"{files}: not a readable certificate and unencrypted key ({_reason(e)})") from None
    return context


def _user(env):
    """(name, password) from etcdctl's variables in `env`, None without a user; ValueError
    for a user without a password: a driver never prompts."""
    name, password = env.get(USER) or None, env.get(PASSWORD) or None
    if name is not None and password is None and ":" in name:
        name, _, password = name.partition(":")
    if name is None:
        if password is not None:
            raise ValueError(f"{PASSWORD} is set without {USER}")
        return None
    if not password:
        raise ValueError(f"{USER} names user {name!r} without a password: set {PASSWORD} (or {USER}=NAME:PASSWORD)")
    return name, password


def _reason(e: Exception) -> str:
    return getattr(e, "strerror", None) or getattr(e, "reason", None) or str(e)


class EtcdStore(Store):
    def __init__(self, url: str, prefix: str = None, timeout: float = 2.0, env=None):
        """The members of `url` (parse); the job's keys under the URL's prefix, else `prefix`;
        TLS and user from etcdctl's variables in `env` (default: this process's). ValueError
        for a URL or a variable that cannot be used; nothing is asked of etcd yet."""
        env = os.environ if env is None else env
        self.members, named = parse(url)
        self.prefix = (named or prefix).rstrip("/") + "/"
        self.timeout = timeout
        self._context = _tls(env, self.members[0].startswith("https://"))
        self._trusted = f"{CACERT}={env[CACERT]}" if env.get(CACERT) else "the system's CAs"
        self._user = _user(env)
        self._token = None  # etcd's for _user, once asked for ("" when etcd has no auth on)
        self._next = 0  # the member that answered last: asked first

    # ---- the gateway ------------------------------------------------------------------
    def _call(self, path: str, body: dict) -> dict:
        """_post with this driver's token, authenticating first when it has none and once
        more when etcd no longer knows it (it expired)."""
        for fresh in (False, True):
            try:
                if self._user is not None and self._token is None:
                    self._token = self._authenticate()
                return self._post(path, body, self._token)
            except _Expired:
                if self._user is None:
                    raise Refused(f"etcd asks for a token: name its user in {USER} and {PASSWORD}") from None
                if fresh:
                    raise Refused(f"etcd refuses the token it just gave user {self._user[0]!r}") from None
                self._token = None

    def _authenticate(self) -> str:
        name, password = self._user
        try:
            return self._post("/v3/auth/authenticate", {"name": name, "password": password})["token"]
        except LookupError as e:
            if NOT_ENABLED in str(e):  # etcdctl goes on without a token too
                return ""
            raise

    def _post(self, path: str, body: dict, token: str = None) -> dict:
        """POST `body` to the members in turn, from the last that answered, until one answers
        or `timeout` x members have passed (an election after a member's loss takes about a
        second, during which members answer nothing); a member down, cut off or without a
        leader (HTTP 5xx) is skipped. A certificate that does not verify, and etcd's refusals
        of the user, raise Refused; its other refusals (4xx) LookupError."""
        data = json.dumps(body).encode()
        headers = {"Content-Type": "application/json", **({"Authorization": token} if token else {})}
        deadline = time.monotonic() + self.timeout * len(self.members)
        errors = {}
        for attempt in itertools.count():
            member = self.members[(self._next + attempt) % len(self.members)]
            left = deadline - time.monotonic()
            if left <= 0:
                break
            if attempt and attempt % len(self.members) == 0:
                time.sleep(min(0.05, left))  # every member refused at once: no busy loop
            request = urllib.request.Request(member + path, data=data, method="POST", headers=headers)
            try:
                with urllib.request.urlopen(request, timeout=min(self.timeout, left),
                                            context=self._context) as answer:
                    text = answer.read()
            except urllib.error.HTTPError as e:
                if e.code < 500:  # etcd's refusal, e.g. a lease it no longer has
                    said = e.read()[:300].decode(errors="replace")
                    if e.code == 401 or any(expired in said for expired in EXPIRED):
                        raise _Expired() from None
                    if any(refused in said for refused in REFUSED):
                        raise Refused(self._refusal(member, said)) from None
                    raise LookupError(f"{member}: HTTP {e.code} {said!r}") from None
                errors[member] = f"HTTP {e.code}"
                continue
            except (OSError, ValueError) as e:  # refused, timed out, reset, unreachable
                reason = getattr(e, "reason", e)
                if isinstance(reason, ssl.SSLCertVerificationError):  # the CA given, or the member's name
                    raise Refused(f"{member}: {reason.verify_message or reason}: the member's certificate does "
                                  f"not verify with {self._trusted}") from None
                errors[member] = str(reason)
                continue
            self._next = self.members.index(member)
            answer = json.loads(text)
            return answer.get("result", answer)  # a stream's one message comes as {"result": ...}
        raise Unreachable("no etcd member answered: " + "; ".join(f"{m}: {e}" for m, e in errors.items()))

    def _refusal(self, member: str, said: str) -> str:
        """One line for etcd's refusal `said` (its JSON or its text)."""
        try:
            said = json.loads(said).get("error", said)
        except ValueError:
            said = said.strip()
        if "CommonName" in said:
            return (f"{member}: etcd refuses a client certificate with a CommonName ({CERT}) through its JSON "
                    f"gateway while auth is on: use one without a CommonName, and {USER} for the user")
        if self._user is None:
            return f"{member}: {said}: etcd has auth on; name its user in {USER} and {PASSWORD}"
        return f"{member}: {said} (user {self._user[0]!r}, keys {self.prefix}...)"

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
