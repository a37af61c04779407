"""A tcpdump capture for the tests that watch a job's traffic, and the forms in which a job's
secret could show up in it."""
import base64
import signal
import subprocess
import time

from hvdlite.worker import kvproto, objects


class Capture:
    """`with Capture(interface, path, *filter) as c:` captures whole packets on `interface`
    from before the block runs to its end; `c.packets()` reads them back."""

    def __init__(self, interface: str, path, *bpf):
        self.path = path
        self.argv = ["tcpdump", "-i", interface, "-U", "-s", "0", "-w", str(path), *bpf]

    def __enter__(self):
        self.dump = subprocess.Popen(self.argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        assert b"listening" in self.dump.stderr.readline()  # capturing before the job starts
        return self

    def __exit__(self, *exc):
        time.sleep(0.5)  # tcpdump writes the last packets
        self.dump.send_signal(signal.SIGINT)
        try:
            self.dump.wait(10)
        except subprocess.TimeoutExpired:
            self.dump.kill()
            self.dump.wait(5)

    def packets(self) -> bytes:
        return self.path.read_bytes()


def secret_forms(secret: str) -> dict:
    """What the wire would show of `secret` (token_urlsafe text) if any of it crossed: the text,
    its bytes, their hex and standard base64, and the keys derived from it."""
    raw = base64.urlsafe_b64decode(secret + "=" * (-len(secret) % 4))
    key = kvproto.job_key(secret)
    forms = {"text": secret.encode(), "bytes": raw, "hex": raw.hex().encode(),
             "base64": base64.b64encode(raw).rstrip(b"="), "text hex": secret.encode().hex().encode(),
             "objects key": objects.key_for(secret), "heartbeat key": kvproto.beat_key(key)}
    return forms


def found(forms: dict, packets: bytes) -> list:
    """The names of the forms that appear in `packets`."""
    return [name for name, form in forms.items() if form in packets]
