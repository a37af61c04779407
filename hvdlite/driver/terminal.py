"""The driver's console: whole lines from every thread, and on a terminal one status line kept
below them (erased before a line is written, drawn again after)."""
import sys
import threading

from hvdlite.printable import printable

_ERASE = "\r\x1b[K"  # carriage return, erase to the end of the line


class Terminal:
    def __init__(self):
        self._lock = threading.Lock()
        self._status = ""  # what the status line shows now; "" when none is drawn

    def say(self, text: str) -> None:
        """The driver's own line on stderr: what it quotes (a checkpoint's cause, a worker's
        reason, a path) reaches the terminal without its control characters."""
        self.write("stderr", printable(text))

    def write(self, stream: str, text: str) -> None:
        """Write a line (or lines) to "stdout" or "stderr", under the status line."""
        console = sys.stdout if stream == "stdout" else sys.stderr
        with self._lock:
            if self._status:
                sys.stderr.write(_ERASE)
                sys.stderr.flush()
            console.write(text if text.endswith("\n") else text + "\n")
            console.flush()
            if self._status:
                sys.stderr.write(self._status)
                sys.stderr.flush()

    def status(self, text: str) -> None:
        """Show `text` as the status line ("" removes it); only on a terminal."""
        with self._lock:
            if not (self._status or text) or not _is_tty(sys.stderr):
                return
            self._status = text
            sys.stderr.write(_ERASE + text)
            sys.stderr.flush()


def _is_tty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # replaced by an object without it, or closed
        return False


def is_tty() -> bool:
    return _is_tty(sys.stderr)


TERMINAL = Terminal()


class StatusKeeper:
    """Redraws the status line from `render()` every `interval` seconds until stopped."""

    def __init__(self, render, interval: float = 1.0, terminal: Terminal = TERMINAL):
        self._render, self._interval, self._terminal = render, interval, terminal
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="hvdlite-status")

    def start(self):
        self._thread.start()
        return self

    def _run(self):
        while True:
            self._terminal.status(self._render())
            if self._stop.wait(self._interval):
                return

    def stop(self):
        self._stop.set()
        self._thread.join(5)
        self._terminal.status("")
