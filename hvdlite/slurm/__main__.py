"""`python -m hvdlite.slurm hosts`: the allocation's live nodes as `host:slots` lines, for
`--host-discovery-script` (the same reading `hvdlite run` does by itself in an allocation)."""
import sys

from hvdlite.discovery.slurm import SlurmHosts, allocation
from hvdlite.errors import HvdliteError, first_line

USAGE = "usage: python -m hvdlite.slurm hosts"


def main(argv) -> int:
    if argv != ["hosts"]:
        print(USAGE, file=sys.stderr)
        return 2
    try:
        alloc = allocation()
        if alloc is None:
            print("hvdlite.slurm: not in a Slurm allocation (SLURM_JOB_ID unset, or set with "
                  "SLURM_STEP_ID inside a step)", file=sys.stderr)
            return 1
        hosts = SlurmHosts(alloc, live=True).read()
    except HvdliteError as e:
        print(f"hvdlite.slurm: {first_line(e)}", file=sys.stderr)
        return e.exit_code
    sys.stdout.write("".join(f"{host}:{slots}\n" for host, slots in hosts))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
