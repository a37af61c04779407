"""Worker output: each line prefixed with the worker's rank, optionally teed to files."""
import os
import threading

from hvdlite.driver.terminal import TERMINAL


class RankOutput:
    """Sink for one worker's stdout and stderr lines: `[rank]<stdout>:line` as Horovod prints.

    `label` is the worker's rank, or its slot until an elastic worker gets a rank; the driver
    updates it when a new world gives the worker another rank.
    """

    def __init__(self, label: str, output_dir=None, folder=None):
        self.label = label
        self.exception = None  # the last line a Python traceback ended with: what it raised
        self._in_traceback = False
        self._lock = threading.Lock()  # the pumps write, the executor closes
        self._files = {}
        if output_dir:
            folder = os.path.join(output_dir, folder or f"rank.{label}")
            os.makedirs(folder, exist_ok=True)
            self._files = {name: open(os.path.join(folder, name), "a", encoding="utf-8")
                           for name in ("stdout", "stderr")}

    def line(self, stream: str, text: str) -> None:
        TERMINAL.write(stream, f"[{self.label}]<{stream}>:{text}")
        if stream == "stderr":
            if text.startswith("Traceback (most recent call last):"):
                self._in_traceback = True
            elif self._in_traceback and text.strip() and not text[0].isspace():
                self._in_traceback = False
                self.exception = text.strip()[:300]
        with self._lock:
            if stream in self._files:
                self._files[stream].write(text)
                self._files[stream].flush()

    def pump(self, stream: str, pipe) -> threading.Thread:
        """Forward a binary pipe line by line on a daemon thread until EOF."""
        def run():
            with pipe:
                for raw in iter(pipe.readline, b""):
                    self.line(stream, raw.decode("utf-8", "replace"))
        thread = threading.Thread(target=run, daemon=True, name=f"output-{self.label}-{stream}")
        thread.start()
        return thread

    def close(self) -> None:
        """Close the files (the worker's output ended); a line still coming is only printed."""
        with self._lock:
            files, self._files = self._files, {}
        for f in files.values():
            f.close()
