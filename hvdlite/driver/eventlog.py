"""The driver's event log: one JSON object per line in --event-log, one line on the console."""
import json
import sys
import threading
import time



class EventLog:
    """Events go to the file always, and to the console when `on_console` (elastic jobs, where
    a job that changes shape should say so) or `verbose`."""

    def __init__(self, path=None, on_console=True, verbose=False, console=sys.stderr):
        self._file = open(path, "a", encoding="utf-8") if path else None
        self._console = console
        self._on_console = on_console or verbose
        self._verbose = verbose
        self._lock = threading.Lock()

    def emit(self, event: str, **fields) -> None:
        record = {"time": time.time(), "event": event, **fields}
        with self._lock:
            if self._file:
                self._file.write(json.dumps(record, default=str) + "\n")
                self._file.flush()
            if self._on_console:
                details = " ".join(f"{k}={v}" for k, v in fields.items())
                self._console.write(f"hvdlite: {event} {details}\n".replace(" \n", "\n"))
                self._console.flush()

    def error(self, message: str) -> None:
        """The one line that says why the job failed; always on the console."""
        with self._lock:
            self._console.write(f"hvdlite: error: {message}\n")
            self._console.flush()

    def debug(self, message: str) -> None:
        if self._verbose:
            with self._lock:
                self._console.write(f"hvdlite: {message}\n")
                self._console.flush()

    def close(self) -> None:
        if self._file:
            self._file.close()
