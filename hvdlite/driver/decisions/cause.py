"""Which failure a static job names: the rank whose failure broke the world, not a peer whose
next collective failed because of it. That peer's HorovodInternalError only echoes the cause,
and its exit can reach the driver first (the rank that raised still prints its traceback, or
the machine is busy); the peer says so as it exits (Exiting.echo), so the driver waits for
the cause rather than for a fixed while."""

CAUSE_WAIT = 1.0  # seconds a failure that says no reason waits for one that does
# Seconds an echo waits for the failure it echoes while other ranks still run: a worker that
# said it is exiting may take as long (Policy.exit_grace); a hung one is named sooner (hangs.py).
ECHO_WAIT = 30.0


class Causes:
    def __init__(self):
        self.echoes = set()  # workers that said they end on a broken world
        self.failures = []  # (when, worker, code, error) of each failed exit, in order

    def echoed(self, worker):
        self.echoes.add(worker)

    def failed(self, worker, code, error, now):
        self.failures.append((now, worker, code, error))

    def named(self, running, now):
        """(worker, code, error) of the failure to name now, or None to wait for a better one:
        the first failure that says why; else the first that is no echo, once CAUSE_WAIT
        passed; else the first echo, once no other rank runs or ECHO_WAIT passed."""
        causes = [f for f in self.failures if f[1] not in self.echoes]
        for _, worker, code, error in causes:
            if error:
                return worker, code, error
        for failures, wait in ((causes, CAUSE_WAIT), (self.failures, ECHO_WAIT)):
            if failures and (not running or now - failures[0][0] >= wait):
                return failures[0][1:]
        return None
