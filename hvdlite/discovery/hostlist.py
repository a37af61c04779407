"""Slurm's compact formats, read in Python: hostlists (`n[1-3,5],vm`, `r[1-2]n[01-02]`) and
task counts per node (`2(x3),1`)."""
import itertools
import re

from hvdlite.discovery.script import DiscoveryError

MAX_NAMES = 100_000  # a hostlist naming more is a typo (n[1-1000000]), not a cluster
_RANGE = re.compile(r"^([0-9]+)(?:-([0-9]+))?$")
_TASKS = re.compile(r"^([0-9]+)(?:\(x([0-9]+)\))?$")


class SlurmFormatError(DiscoveryError):
    """A hostlist or task count Slurm would not have written; the message names it."""


def expand(hostlist: str) -> list:
    """Every host a hostlist names, in order, repeats kept (as `scontrol show hostnames`)."""
    names = []
    for item in _items(hostlist):
        names += _expand_item(item, hostlist)
        if len(names) > MAX_NAMES:
            raise SlurmFormatError(f"hostlist {hostlist!r} names more than {MAX_NAMES} hosts")
    return names


def _items(hostlist):
    """Split at commas and blanks outside brackets."""
    items, current, inside = [], "", False
    for ch in hostlist:
        if ch == "[":
            if inside:
                raise SlurmFormatError(f"hostlist {hostlist!r}: '[' inside brackets")
            inside = True
        elif ch == "]":
            if not inside:
                raise SlurmFormatError(f"hostlist {hostlist!r}: ']' without '['")
            inside = False
        if not inside and (ch == "," or ch.isspace()):
            if current:
                items.append(current)
            current = ""
        else:
            current += ch
    if inside:
        raise SlurmFormatError(f"hostlist {hostlist!r}: '[' without ']'")
    if current:
        items.append(current)
    return items


def _expand_item(item, hostlist):
    # "r[1-2]n[01-02]" -> ["r", "[1-2]", "n", "[01-02]", ""]: brackets multiply
    parts = re.split(r"(\[[^\]]*\])", item)
    choices = [_numbers(p[1:-1], hostlist) if p.startswith("[") else [p] for p in parts]
    return ["".join(c) for c in itertools.product(*choices)]


def _numbers(body, hostlist):
    """'1-3,5' -> ['1','2','3','5']; a range is as wide as its first bound ('08-10')."""
    out = []
    for part in body.split(","):
        m = _RANGE.match(part)
        if not m:
            raise SlurmFormatError(f"hostlist {hostlist!r}: bad range {part!r}")
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        if hi < lo:
            raise SlurmFormatError(f"hostlist {hostlist!r}: range {part!r} runs backwards")
        if hi - lo >= MAX_NAMES:
            raise SlurmFormatError(f"hostlist {hostlist!r} names more than {MAX_NAMES} hosts")
        width = len(m.group(1))
        out += [str(n).zfill(width) for n in range(lo, hi + 1)]
    return out


def tasks_per_node(text: str) -> list:
    """SLURM_TASKS_PER_NODE ('2(x3),1') -> [2, 2, 2, 1]."""
    counts = []
    for part in text.split(","):
        m = _TASKS.match(part.strip())
        if not m or (m.group(2) is not None and int(m.group(2)) == 0):
            raise SlurmFormatError(f"SLURM_TASKS_PER_NODE={text!r}: cannot read {part!r} "
                                   "(expected N or N(xM) items, e.g. 2(x3),1)")
        repeat = int(m.group(2) or 1)
        if len(counts) + repeat > MAX_NAMES:
            raise SlurmFormatError(f"SLURM_TASKS_PER_NODE={text!r} counts more than "
                                   f"{MAX_NAMES} nodes")
        counts += [int(m.group(1))] * repeat
    return counts
