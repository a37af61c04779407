"""Parsing of host lists: -H, --hostfile and discovery output."""
import re

from hvdlite.errors import UsageError

_NAME = re.compile(r"^[A-Za-z0-9_.\-\[\]:]+$")


class HostSpecError(UsageError):
    """A host specification that cannot be used; the message is shown to the user as is."""


def _host(name: str, slots: str, where: str):
    if not name or not _NAME.match(name):
        raise HostSpecError(f"{where}: invalid host name {name!r}")
    if not slots.isdigit() or int(slots) < 1:
        raise HostSpecError(f"{where}: slots for {name} must be a positive integer, got {slots!r}")
    return name, int(slots)


def _merge(pairs):
    """Keep first-seen order; a repeated host keeps its first slot count."""
    seen = {}
    for name, slots in pairs:
        seen.setdefault(name, slots)
    return list(seen.items())


def parse_hosts(spec: str):
    """'h1:2,h2:4' (slots default 1) -> [('h1', 2), ('h2', 4)]."""
    pairs = []
    for item in spec.split(","):
        item = item.strip()
        if not item:
            raise HostSpecError(f"-H {spec!r}: empty host entry")
        name, _, slots = item.rpartition(":") if ":" in item else (item, "", "1")
        pairs.append(_host(name, slots, f"-H {spec!r}"))
    return _merge(pairs)


def parse_hostfile(path: str):
    """Lines 'host slots=N', 'host:N' or just 'host'; '#' starts a comment."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise HostSpecError(f"cannot read hostfile {path}: {e}") from None
    pairs = []
    for number, line in enumerate(lines, 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{path}:{number}"
        name, *rest = line.split()
        if not rest and ":" in name:  # 'host:N', as -H and discovery spell it
            host, _, slots = name.rpartition(":")
            pairs.append(_host(host, slots, where))
        elif not rest:
            pairs.append(_host(name, "1", where))
        elif len(rest) == 1 and rest[0].startswith("slots="):
            pairs.append(_host(name, rest[0][len("slots="):], where))
        else:
            raise HostSpecError(f"{where}: expected 'host slots=N' or 'host:N', got {line!r}")
    if not pairs:
        raise HostSpecError(f"hostfile {path} lists no hosts")
    return _merge(pairs)


def parse_discovery_output(text: str, default_slots=None):
    """Discovery script output: 'host' or 'host:slots' per line; blanks and duplicates ignored."""
    pairs = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        where = f"discovery output line {number}"
        if ":" in line:
            name, _, slots = line.rpartition(":")
        elif default_slots is None:
            raise HostSpecError(f"{where}: {line!r} has no slot count and --slots-per-host is not set")
        else:
            name, slots = line, str(default_slots)
        pairs.append(_host(name, slots, where))
    return _merge(pairs)
