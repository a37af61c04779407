"""Every exit code hvdlite gives a meaning to, in one table: `hvdlite run --help` prints TABLE,
docs/signals.md#exit-codes shows it, and tests/test_docs.py checks that the two say the same.

RESUMABLE is sysexits.h's EX_TEMPFAIL ("a temporary failure; the user is invited to retry
later"), the one standard code that says "run me again": a job that stopped at a commit and
wrote its checkpoint resumes there when the same command runs again.
"""
import signal

FINISHED = 0
FAILED = 1
USAGE = 2
RESUMABLE = 75  # the driver: stopped on a signal at a commit, checkpoint written (--checkpoint-dir)
LOST_DRIVER = 75  # a worker: no contact with the driver for the liveness timeout; it exited
UNLOADABLE = 65  # a checkpoint in --checkpoint-dir does not load (sysexits' EX_DATAERR)
LEFT = 79  # a worker: left the job at a commit (SIGTERM, or the job stopping); not a failure
# The driver: another driver holds the job's lease (--checkpoint-dir): it took the job over from
# this one, or held a live lease when this one started. sysexits' EX_PROTOCOL.
NOT_LEADER = 76
# Each stops an elastic job gracefully (every worker leaves at its next commit, docs/signals.md);
# a second one, or any to a static job, stops it at once with 128 + the signal's number.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)

# (code, who, meaning): the driver's codes (what `hvdlite run` exits with), then a worker's.
TABLE = (
    ("0", "driver", "the job finished: every worker exited 0 (static), or a worker's training "
                    "function returned and the rest of its world ended (elastic; workers that "
                    "failed on the way are named, and the job still finishes unless "
                    "--fail-on-worker-failure)"),
    ("1", "driver", "the job failed; one line `hvdlite: error: ...` says why"),
    ("2", "driver", "usage error: bad or contradictory flags, a missing script or file"),
    ("65", "driver", "a checkpoint in --checkpoint-dir does not load (sysexits' EX_DATAERR)"),
    ("75", "driver", "stopped on a signal with a checkpoint in --checkpoint-dir: run the same "
                     "command again to resume (sysexits' EX_TEMPFAIL)"),
    ("76", "driver", "another driver holds this job's lease (--checkpoint-dir): it took the job "
                     "over, so this one stopped deciding at once, or it was running when this one "
                     "started (docs/failover.md)"),
    ("128+N", "driver", "stopped by signal N with nothing to resume from: 130 Ctrl-C, 143 "
                        "SIGTERM, 138 SIGUSR1"),
    ("0", "worker", "finished, or told to leave (its slot is gone or beyond --max-np)"),
    ("1", "worker", "the script raised, or hvdlite ended it with a one-line error"),
    ("65", "worker", "a checkpoint in --checkpoint-dir does not load"),
    ("75", "worker", "lost the driver for --liveness-timeout (--driver-grace with --checkpoint-dir): "
                     "the driver's trouble, not a failure"),
    ("79", "worker", "left the job at a commit (SIGTERM, or the job stopping): not a failure"),
    ("-N", "worker", "killed by signal N: a failure, unless the driver was stopping it"),
)
