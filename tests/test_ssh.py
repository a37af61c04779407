"""SSH launcher against real sshd test hosts (tests/sshhosts.py): no mocks."""
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from hvdlite.driver.output import RankOutput
from hvdlite.driver.launchers.locality import is_local
from hvdlite.driver.launchers.ssh import LOST, SSHError, SSHHost, SSHSettings, launch
from jobs import skip_without_partitions

PY = sys.executable  # absolute: no PATH or pyenv shims needed on the hosts


@pytest.fixture(scope="module")
def hosts(ssh_hosts):
    return ssh_hosts(2)


@pytest.fixture(scope="module")
def host1(hosts):
    host = SSHHost("host-1", SSHSettings(ssh_config=hosts.ssh_config, connect_timeout=5))
    yield host
    host.close()


def remote_procs(hosts, name, marker):
    return [p for p in hosts.processes(name) if marker in p[2]]


def write_config(hosts, path, name, **options):
    """An ssh_config for one test host with some options replaced."""
    h = hosts.hosts[name]
    entries = {"HostName": h.address, "Port": h.port, "User": hosts.user,
               "IdentityFile": hosts.identity_file, "UserKnownHostsFile": hosts.known_hosts,
               "GlobalKnownHostsFile": "/dev/null", **options}
    with open(path, "w") as f:
        f.write(f"Host {name}\n" + "".join(f"  {k} {v}\n" for k, v in entries.items() if v is not None))
    return str(path)


def test_env_cwd_output_and_no_secret_on_command_lines(hosts, host1, tmp_path, capsys):
    secret = "s3cret-" + os.urandom(8).hex()
    tricky = "it's \"quoted\" $HOME `x` \\ and\nsecond line"
    env = {"HVDLITE_SECRET_KEY": secret, "TRICKY": tricky, "EMPTY": "", "HVDLITE_RANK": "3",
           "bad-name": "skipped"}
    marker = "envcheck-" + os.urandom(4).hex()
    code = textwrap.dedent(f"""
        import os, socket, sys, time
        print("cwd", os.getcwd())
        print("host", socket.gethostname())
        for k in ("HVDLITE_SECRET_KEY", "TRICKY", "EMPTY", "HVDLITE_RANK"):
            print(k, repr(os.environ.get(k)))
        print("pgid", os.getpgid(0), "pid", os.getpid())
        print("to stderr", file=sys.stderr)
        sys.stdout.flush(); sys.stderr.flush()
        time.sleep(30)  # {marker}
        """)
    cwd = str(tmp_path)
    worker = launch(host1, [PY, "-c", code], env, cwd, RankOutput("3"))
    try:
        assert worker.skipped_env == ["bad-name"]
        deadline = time.monotonic() + 10
        out = err = ""
        while "pgid" not in out and time.monotonic() < deadline:
            time.sleep(0.05)
            captured = capsys.readouterr()
            out, err = out + captured.out, err + captured.err
        assert worker.poll() is None
        lines = out.splitlines()
        assert f"[3]<stdout>:cwd {cwd}" in lines
        assert "[3]<stdout>:host host-1" in lines
        assert f"[3]<stdout>:HVDLITE_SECRET_KEY {secret!r}" in lines
        assert f"[3]<stdout>:TRICKY {tricky!r}" in lines
        assert "[3]<stdout>:EMPTY ''" in lines
        assert "[3]<stdout>:HVDLITE_RANK '3'" in lines
        assert f"[3]<stdout>:pgid {worker.pid} pid {worker.pid}" in lines
        # the secret is in the worker's environment only, never on a command line of the host
        ps = hosts.run("host-1", ["ps", "-ww", "-eo", "pid,args"]).stdout
        assert marker in ps and secret not in ps
    finally:
        worker.stop(grace=1.0)
    assert worker.poll() == -signal.SIGTERM
    assert "[3]<stderr>:to stderr" in (err + capsys.readouterr().err).splitlines()
    assert not remote_procs(hosts, "host-1", marker)


def test_stop_kills_a_tree_that_ignores_hup_and_term(hosts, host1):
    marker = "stubborn-" + os.urandom(4).hex()
    code = textwrap.dedent(f"""
        import signal, subprocess, sys, time
        child = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                 "signal.signal(signal.SIGHUP, signal.SIG_IGN); print('child up', flush=True); time.sleep(60)")
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        subprocess.Popen([sys.executable, "-c", child, "{marker}"])
        time.sleep(60)  # {marker}
        """)
    worker = launch(host1, [PY, "-c", code], {}, "/", RankOutput("0"))
    deadline = time.monotonic() + 10
    while len(remote_procs(hosts, "host-1", marker)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(remote_procs(hosts, "host-1", marker)) == 2
    t = time.monotonic()
    worker.stop(grace=0.5)
    took = time.monotonic() - t
    assert worker.poll() == -signal.SIGKILL
    assert not remote_procs(hosts, "host-1", marker)
    assert took < 3, took


def test_exit_codes_and_signal_death(host1):
    ok = launch(host1, [PY, "-c", "pass"], {}, "/", RankOutput("0"))
    seven = launch(host1, [PY, "-c", "import sys; sys.exit(7)"], {}, "/", RankOutput("1"))
    killed = launch(host1, [PY, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"],
                          {}, "/", RankOutput("2"))
    missing = launch(host1, ["/nonexistent/worker"], {}, "/", RankOutput("3"))
    assert ok.wait(10) == 0
    assert seven.wait(10) == 7
    assert killed.wait(10) == -signal.SIGKILL
    assert missing.wait(10) == 127
    for w in (ok, seven, killed, missing):
        w.finish_output()
        assert w.error is None


def test_bad_working_directory_fails_the_worker(host1, capsys):
    w = launch(host1, [PY, "-c", "pass"], {}, "/nonexistent-dir", RankOutput("4"))
    assert w.wait(10) not in (0, None)
    w.finish_output()
    assert "nonexistent-dir" in capsys.readouterr().err


def test_run_helper_reports_code_and_output(host1):
    assert host1.run("echo out; echo err >&2; exit 3") == (3, "out\n", "err\n")


def test_auth_failure_with_wrong_key(hosts, tmp_path):
    wrong = tmp_path / "wrong_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(wrong)], check=True, timeout=30)
    config = write_config(hosts, tmp_path / "config", "host-1", IdentityFile=wrong, IdentitiesOnly="yes")
    with pytest.raises(SSHError) as e:
        SSHHost("host-1", SSHSettings(ssh_config=config, connect_timeout=5)).connect()
    msg = str(e.value)
    assert "authentication failed" in msg and "host-1" in msg and str(wrong) in msg
    assert "\n" not in msg
    # --ssh-identity-file is tried before the config's keys
    host = SSHHost("host-1", SSHSettings(ssh_config=config, identity_file=hosts.identity_file))
    host.connect()
    host.close()


def test_missing_identity_file_is_reported(hosts, tmp_path):
    with pytest.raises(SSHError, match="identity file .*does not exist"):
        SSHHost("host-1", SSHSettings(ssh_config=hosts.ssh_config, identity_file=str(tmp_path / "nope")))


def test_unknown_host_key_needs_the_accept_flag(hosts, tmp_path):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    config = write_config(hosts, tmp_path / "config", "host-1", UserKnownHostsFile=empty)
    with pytest.raises(SSHError) as e:
        SSHHost("host-1", SSHSettings(ssh_config=config, connect_timeout=5)).connect()
    msg = str(e.value)
    assert "host-1" in msg and "not in known_hosts" in msg and "--ssh-accept-unknown-hosts" in msg
    assert "SHA256:" in msg
    host = SSHHost("host-1", SSHSettings(ssh_config=config, accept_unknown_hosts=True, connect_timeout=5))
    host.connect()
    assert host.accepted_key and host.accepted_key.startswith("ssh-ed25519 SHA256:")
    host.close()
    assert empty.read_text() == ""  # accepted in memory only


def test_changed_host_key_is_refused_even_with_the_accept_flag(hosts, tmp_path):
    h1, h2 = hosts.hosts["host-1"], hosts.hosts["host-2"]
    known = tmp_path / "known_hosts"
    where = h1.address if h1.port == 22 else f"[{h1.address}]:{h1.port}"
    known.write_text(f"{where} {h2.host_key}\n")  # host-2's key filed under host-1
    config = write_config(hosts, tmp_path / "config", "host-1", UserKnownHostsFile=known)
    with pytest.raises(SSHError, match="does not match known_hosts"):
        SSHHost("host-1", SSHSettings(ssh_config=config, accept_unknown_hosts=True, connect_timeout=5)).connect()


def test_refused_port(hosts):
    host = SSHHost("host-1", SSHSettings(ssh_config=hosts.ssh_config, port=2, connect_timeout=5))
    with pytest.raises(SSHError) as e:
        host.connect()
    assert "refused" in str(e.value) and "port 2" in str(e.value) and "host-1" in str(e.value)


def test_dns_failure():
    """Resolved inside a fresh network namespace without interfaces, so no query leaves the box."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare for a network namespace without DNS")
    code = ("from hvdlite.driver.launchers.ssh import SSHHost, SSHSettings, SSHError\n"
            "try:\n"
            "    SSHHost('no-such-host.invalid', SSHSettings(ssh_config=None, connect_timeout=3)).connect()\n"
            "except SSHError as e:\n"
            "    print(e)\n")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run(["unshare", "--net", PY, "-c", code], capture_output=True, text=True,
                       timeout=30, cwd=root)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("cannot resolve SSH host no-such-host.invalid:"), r.stdout


def test_partition_fails_the_worker_within_seconds(hosts, tmp_path):
    skip_without_partitions(hosts)
    host = SSHHost("host-2", SSHSettings(ssh_config=hosts.ssh_config, connect_timeout=5))
    marker = "partitioned-" + os.urandom(4).hex()
    worker = launch(host, [PY, "-c", f"import time; print('up', flush=True); time.sleep(60)  # {marker}"],
                         {}, "/", RankOutput("0"))
    try:
        assert worker.wait(0.5) is None
        hosts.partition("host-2")
        t = time.monotonic()
        code = worker.wait(10)
        took = time.monotonic() - t
        assert code == LOST, (code, took)
        assert "lost the SSH connection to host-2" in worker.error
        assert took < 10
        # while cut off, a new connection times out with a clear message
        probe = SSHHost("host-2", SSHSettings(ssh_config=hosts.ssh_config, connect_timeout=1))
        with pytest.raises(SSHError, match="timed out after 1 s"):
            probe.connect()
    finally:
        hosts.heal("host-2")
    # sshd left the worker running on the host; once it is reachable, stop() still ends it
    assert remote_procs(hosts, "host-2", marker)
    worker.stop(grace=0.5)
    assert not remote_procs(hosts, "host-2", marker)
    host.close()


def test_more_slots_than_sshd_max_sessions_and_host_death(ssh_hosts):
    hosts = ssh_hosts(1, sshd_options={"MaxSessions": 2})
    host = SSHHost("host-1", SSHSettings(ssh_config=hosts.ssh_config, connect_timeout=5))
    workers = [launch(host, [PY, "-c", "import time; time.sleep(60)  # maxsessions"], {}, "/", RankOutput(str(i)))
               for i in range(3)]
    assert len({w.channel.get_transport() for w in workers}) == 2
    assert all(w.poll() is None for w in workers)
    host.failure_memory = 0  # retry at once below instead of repeating the last failure
    hosts.kill_all("host-1")  # the host dies: every worker on it reports a lost connection
    for w in workers:
        assert w.wait(5) == LOST
        assert "lost the SSH connection" in w.error
    with pytest.raises(SSHError, match="refused"):
        launch(host, ["true"], {}, "/", RankOutput("x"))
    hosts.start("host-1")
    assert launch(host, ["true"], {}, "/", RankOutput("y")).wait(10) == 0
    host.close()
    hosts.close()


def test_is_local(hosts, tmp_path):
    assert is_local("localhost", ssh_config=None)
    assert is_local("127.0.0.1", ssh_config=None)
    assert is_local("::1", ssh_config=None)
    assert is_local(socket.gethostname(), ssh_config=None)
    if hosts.mode == "netns":
        assert is_local(hosts.driver_address, ssh_config=None)       # the bridge is this machine
        assert not is_local(hosts.addresses["host-1"], ssh_config=None)  # another network namespace
        assert not is_local("host-1", ssh_config=hosts.ssh_config)    # via its HostName, no DNS
    alias = tmp_path / "config"
    alias.write_text("Host here\n  HostName 127.0.0.1\n")
    assert is_local("here", ssh_config=str(alias))
