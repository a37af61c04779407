"""Running the host discovery script once: bounded in time and output, errors as one line."""
import os
import selectors
import signal
import subprocess
import time

from hvdlite.discovery.hostspec import HostSpecError, parse_discovery_output
from hvdlite.errors import HvdliteError

MAX_OUTPUT = 1 << 20  # bytes; a listing of hosts is never near this
DRAIN = 0.5  # seconds to read what is left once the script ended: an escaped child may hold the pipe


class DiscoveryError(HvdliteError):
    """The script failed, hung or printed something unusable; the message says which."""


def discover(script: str, timeout: float, default_slots=None, env=None):
    """Run `script` (a shell command line; `env`: its environment, default the driver's) and
    return its hosts as [(name, slots)]."""
    proc = subprocess.Popen(["/bin/sh", "-c", script], stdin=subprocess.DEVNULL, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err, code = _collect(proc, timeout)
    finally:
        _kill_group(proc)
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


def _collect(proc, timeout):
    """(stdout, stderr, exit code or None on timeout), never blocking past the deadlines:
    reads both pipes without threads, and stops reading DRAIN seconds after the script ended
    even if a child it left behind keeps the pipes open."""
    out, err = bytearray(), bytearray()
    sinks = {proc.stdout.fileno(): out, proc.stderr.fileno(): err}
    deadline = time.monotonic() + timeout
    code = None
    with selectors.DefaultSelector() as sel:
        for fd in sinks:
            os.set_blocking(fd, False)
            sel.register(fd, selectors.EVENT_READ)
        while sel.get_map():
            if code is None:
                code = proc.poll()
                if code is not None:
                    deadline = min(deadline, time.monotonic() + DRAIN)
            left = deadline - time.monotonic()
            if left <= 0:
                break
            for key, _ in sel.select(min(left, 0.05)):
                chunk = os.read(key.fd, 65536)
                sink = sinks[key.fd]
                if not chunk:
                    sel.unregister(key.fd)
                elif len(sink) <= MAX_OUTPUT:  # one byte past the limit tells it was too large
                    sink.extend(chunk[:MAX_OUTPUT + 1 - len(sink)])
    if code is None:  # both pipes closed (or the deadline passed) before the script ended
        try:
            code = proc.wait(max(deadline - time.monotonic(), 0.0))
        except subprocess.TimeoutExpired:
            pass
    proc.stdout.close()
    proc.stderr.close()
    return bytes(out), bytes(err), code


def _kill_group(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        pass
