"""The job's timeouts from one knob: which defaults `--timeout-scale` multiplies, and the order
among them that the driver and the workers rely on, checked before anything starts
(docs/troubleshooting.md#timeouts lists every timeout)."""
from hvdlite import defaults
from hvdlite.errors import UsageError

# Settings field -> (flag, base default). These bound waits on other machines, the network and
# the scheduler, all slower together on a loaded or large cluster: one scale moves them at once
# and keeps their order. --stop-timeout does not scale (Slurm's KillWait, 30 s, bounds it from
# outside), nor --discovery-interval (a rate, not a wait).
SCALED = {
    "start_timeout": ("--start-timeout", defaults.START_TIMEOUT),
    "liveness_timeout": ("--liveness-timeout", defaults.LIVENESS_TIMEOUT),
    "collective_timeout": ("--gloo-timeout-seconds", defaults.COLLECTIVE_TIMEOUT),
    "elastic_timeout": ("--elastic-timeout", defaults.ELASTIC_TIMEOUT),
    "discovery_timeout": ("--discovery-timeout", defaults.DISCOVERY_TIMEOUT),
    "driver_grace": ("--driver-grace", defaults.DRIVER_GRACE),
}
# --hang-timeout has no fixed default: the job's stalls set it (driver/decisions/hangs.py),
# never below this floor, which scales with the others, nor below twice the liveness timeout
# (a silent worker is that timeout's to judge). Only a given --hang-timeout can be refused.
HANG = ("--hang-timeout", defaults.HANG_FLOOR)


def resolve(given: dict, scale: float) -> dict:
    """Field -> seconds: the flag's value where given (not None), else its default times `scale`;
    hang_timeout stays None unless given, and hang_floor is its floor."""
    seconds = {field: given[field] if given.get(field) is not None else base * scale
               for field, (_, base) in SCALED.items()}
    seconds["hang_timeout"] = given.get("hang_timeout")
    seconds["hang_floor"] = max(HANG[1] * scale, 2 * seconds["liveness_timeout"])
    return seconds


def check(seconds: dict, given=(), scale: float = defaults.TIMEOUT_SCALE) -> None:
    """UsageError, one line naming both sides, when `seconds` (resolve's) contradict an order
    the job relies on. `given`: the fields set by their own flag; the others came from the scale."""
    def named(field):
        flag, base = SCALED.get(field, HANG)
        came = "" if field in given or scale == 1 else f" ({base:g} x --timeout-scale {scale:g})"
        return f"{flag} {seconds[field]:g}{came}"

    beats = 2 * defaults.HEARTBEAT_INTERVAL
    if seconds["liveness_timeout"] < beats:
        raise UsageError(f"{named('liveness_timeout')} is shorter than two heartbeat intervals "
                         f"({beats:g} s): one late heartbeat would get a live worker killed")
    if seconds["liveness_timeout"] >= seconds["collective_timeout"]:
        raise UsageError(f"{named('liveness_timeout')} must be shorter than "
                         f"{named('collective_timeout')}: the survivors of a lost worker would give "
                         f"up their collective before the driver knows which worker is gone")
    if seconds["driver_grace"] < seconds["liveness_timeout"]:
        raise UsageError(f"{named('driver_grace')} must not be shorter than {named('liveness_timeout')}: "
                         f"a worker gives up a silent driver after the liveness timeout anyway")
    hang = seconds["hang_timeout"]
    if hang is None:
        return
    if hang <= seconds["liveness_timeout"]:
        raise UsageError(f"{named('hang_timeout')} must be longer than {named('liveness_timeout')}: a "
                         f"silent worker is the liveness timeout's to judge, and a hung one must "
                         f"still answer for its stack")
    if hang >= seconds["collective_timeout"]:
        raise UsageError(f"{named('hang_timeout')} must be shorter than {named('collective_timeout')}: "
                         f"the peers' collective would give up first, and a rank that waits would be "
                         f"blamed instead of the one it waits on")
