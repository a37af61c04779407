"""The exit codes hvdlite gives a meaning to, besides 0 and 1 (docs/signals.md lists them all).

RESUMABLE is sysexits.h's EX_TEMPFAIL ("a temporary failure; the user is invited to retry
later"), the one standard code that says "run me again": a job that stopped at a commit and
wrote its checkpoint resumes there when the same command runs again.
"""
RESUMABLE = 75  # the driver: stopped on a signal at a commit, checkpoint written (--checkpoint-dir)
LOST_DRIVER = 75  # a worker: no contact with the driver for the liveness timeout; it exited
UNLOADABLE = 65  # a checkpoint in --checkpoint-dir does not load (sysexits' EX_DATAERR)
LEFT = 79  # a worker: left the job at a commit (SIGTERM, or the job stopping); not a failure
