"""The driver's event log: one JSON object per line in --event-log, one sentence on the console."""
import json
import threading
import time

from hvdlite.driver.sentences import sentence
from hvdlite.driver.terminal import TERMINAL


class EventLog:
    """Events go to the file always, to the console when `on_console` (elastic jobs, where
    a job that changes shape should say so) or `verbose`, and to every listener
    (`listener(event, fields, time)`)."""

    def __init__(self, path=None, on_console=True, verbose=False, listeners=()):
        self._file = open(path, "a", encoding="utf-8") if path else None
        self._on_console = on_console or verbose
        self._verbose = verbose
        self._listeners = list(listeners)
        self._lock = threading.Lock()

    def emit(self, event: str, **fields) -> None:
        self._record(event, fields, self._on_console)

    def announce(self, event: str, **fields) -> None:
        """emit(), said on the console even in a job that shows no events (an interruption)."""
        self._record(event, fields, True)

    def _record(self, event, fields, on_console) -> None:
        record = {"time": time.time(), "event": event, **fields}
        with self._lock:
            if self._file:
                self._file.write(json.dumps(record, default=str) + "\n")
                self._file.flush()
            for listener in self._listeners:
                listener(event, fields, record["time"])
            # A failure's end is said once, by error(): `hvdlite: error: why`.
            if on_console and not (event == "job_end" and fields.get("result") == "failure"):
                TERMINAL.say(f"hvdlite: {sentence(event, fields)}")

    def error(self, message: str) -> None:
        """The one line that says why the job failed; always on the console."""
        TERMINAL.say(f"hvdlite: error: {message}")

    def say(self, message: str) -> None:
        """A line the user should see whatever the log level (where hosts come from, ...)."""
        TERMINAL.say(f"hvdlite: {message}")

    def debug(self, message: str) -> None:
        if self._verbose:
            TERMINAL.say(f"hvdlite: {message}")

    def close(self) -> None:
        if self._file:
            self._file.close()
