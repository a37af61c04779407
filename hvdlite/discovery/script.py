"""Running the host discovery script once: bounded in time and output, errors as one line."""
import os
import signal
import subprocess
import threading

from hvdlite.driver.hosts import HostSpecError, parse_discovery_output

MAX_OUTPUT = 1 << 20  # bytes; a listing of hosts is never near this


class DiscoveryError(Exception):
    """The script failed, hung or printed something unusable; the message says which."""


def discover(script: str, timeout: float, default_slots=None):
    """Run `script` (a shell command line) and return its hosts as [(name, slots)]."""
    proc = subprocess.Popen(["/bin/sh", "-c", script], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    out, err = bytearray(), bytearray()
    readers = [threading.Thread(target=_read, args=(proc.stdout, out), daemon=True),
               threading.Thread(target=_read, args=(proc.stderr, err), daemon=True)]
    for r in readers:
        r.start()
    try:
        code = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        code = None
    finally:
        _kill_group(proc)
        for r in readers:
            r.join(2)
        proc.stdout.close()
        proc.stderr.close()
    if code is None:
        raise DiscoveryError(f"host discovery script timed out after {timeout:g} s and was killed")
    if code != 0:
        last = err.decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
        raise DiscoveryError(f"host discovery script exited with code {code}"
                             + (f": {last[0][:200]}" if last[0] else ""))
    if len(out) > MAX_OUTPUT:
        raise DiscoveryError(f"host discovery script printed more than {MAX_OUTPUT} bytes")
    try:
        text = out.decode("utf-8")
    except UnicodeDecodeError:
        raise DiscoveryError("host discovery script printed bytes that are not UTF-8") from None
    try:
        return parse_discovery_output(text, default_slots)
    except HostSpecError as e:
        raise DiscoveryError(f"host discovery script: {e}") from None


def _read(pipe, sink: bytearray):
    # Keep one byte past the limit so the caller can tell the output was too large.
    while chunk := pipe.read1(65536) if hasattr(pipe, "read1") else pipe.read(65536):
        if len(sink) <= MAX_OUTPUT:
            sink.extend(chunk[:MAX_OUTPUT + 1 - len(sink)])


def _kill_group(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        pass
