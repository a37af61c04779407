"""A tcpdump capture for the tests that watch a job's traffic, and the forms in which a job's
secret could show up in it."""
import base64
import os
import re
import signal
import subprocess
import sys
import time

from hvdlite.worker import env, kvproto, objects

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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


def launch_seen(packets: bytes):
    """(ticket, rendezvous address, port) of a claim as the wire shows it in a launch."""
    def value(name, pattern):  # after `NAME=` (srun's environment) or its pickle's framing (Ray's)
        match = re.search(re.escape(name.encode()) + rb".{1,16}?(" + pattern + rb")", packets, re.DOTALL)
        return match.group(1).decode() if match else None
    return (value(env.CLAIM, rb"[0-9a-f]{64}:[0-9a-f]{32}"),
            value(env.RENDEZVOUS_ADDR, rb"\d+\.\d+\.\d+\.\d+"), value(env.RENDEZVOUS_PORT, rb"\d{2,5}"))


def replay(netns: str, ticket: str, addr: str, port: str) -> str:
    """Claim the secret with a ticket read off the wire, from the network namespace `netns` (a
    node of the cluster); what the claim said (the secret, or why it was refused)."""
    code = ("import sys; from hvdlite.worker.claim import claim, ClaimRefused\n"
            "try: print('GOT', claim(sys.argv[1], int(sys.argv[2]), sys.argv[3], 5.0))\n"
            "except ClaimRefused as e: print(e)")
    out = subprocess.run(["nsenter", f"--net=/run/netns/{netns}", sys.executable, "-c", code, addr, port, ticket],
                         capture_output=True, text=True, timeout=30, env={**os.environ, "PYTHONPATH": ROOT})
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


HOLD = os.path.join(ROOT, "tests", "scripts", "hold_secret.py")


def watched_job(start, interface: str, tmp_path, netns: str, workers: int = 2):
    """Run the job `start(folder)` starts (a jobs.Job of `workers` hold_secret.py workers writing
    to folder) under a capture on `interface`; once every worker holds the secret, replay the
    claim the wire shows from `netns`. Returns (the job's Result, the packets, the secret,
    what the replay said; None when the wire showed no claim)."""
    folder = tmp_path / "held"
    folder.mkdir()
    with Capture(interface, tmp_path / "wire.pcap") as capture:
        with start(folder) as job:
            deadline = time.monotonic() + 120
            while len(list(folder.glob("secret.*"))) < workers:
                assert job.proc.poll() is None and time.monotonic() < deadline, job.read(job.err)[-3000:]
                time.sleep(0.1)
            ticket, addr, port = launch_seen(capture.packets())
            replayed = replay(netns, ticket, addr, port) if ticket else None
            (folder / "go").touch()
            result = job.finish(60)
    secrets = {p.read_text() for p in folder.glob("secret.*")}
    assert len(secrets) == 1, secrets
    return result, capture.packets(), secrets.pop(), replayed


def check_the_wire(result, packets: bytes, secret: str, replayed) -> None:
    """What watched_job saw of a job on a cluster whose launches cross the network: the job
    succeeded, no form of its secret was on the wire though its launches and rendezvous were,
    and the token read off the wire was refused, which the driver said once."""
    assert result.code == 0, result.stderr
    assert found(secret_forms(secret), packets) == []
    assert packets.count(env.CLAIM.encode()) >= 2 and b"X-Hvdlite-Auth" in packets
    assert replayed == "hvdlite: the driver refused this worker's launch token: it was used already"
    assert result.stderr.count("refused a second use of worker") == 1, result.stderr
