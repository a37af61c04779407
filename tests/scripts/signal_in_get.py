"""A stop signal landing while the driver's decision thread waits for its next event: the
handler posts StopRequested, as hvdlite.driver.job.run's does, one signal at a time, for
SECONDS seconds; prints how many were handled. A handler that cannot post from inside the
queue's own get() hangs here for good."""
import os
import signal
import sys
import threading
import time

from hvdlite.driver.decisions.messages import StopRequested
from hvdlite.driver.eventlog import EventLog
from hvdlite.driver.job import Job
from hvdlite.driver.settings import Settings

SECONDS = float(sys.argv[1])
job = Job(Settings(command=["true"]), EventLog(on_console=False))
handled = []


def on_signal(signum, frame):
    job.events.put(StopRequested(signum))
    handled.append(signum)


def pester():
    while True:
        n = len(handled)
        os.kill(os.getpid(), signal.SIGUSR1)
        while len(handled) == n:  # the next one once this one was handled
            time.sleep(0.0005)


signal.signal(signal.SIGUSR1, on_signal)
threading.Thread(target=pester, daemon=True).start()
end = time.monotonic() + SECONDS
while time.monotonic() < end:
    job.next_event(0.0)
print("handled", len(handled))
