"""The etcd store as production runs etcd: TLS (`etcds://`), client certificates required, and
auth on, configured by etcdctl's variables; tokens that expire are replaced without losing the
lease; bad settings end a driver in one line. One real member on loopback (etcdcluster.SecureEtcd)."""
import os
import time

import pytest

from hvdlite.cli import main
from hvdlite.driver.store.etcd import EtcdStore, parse
from jobs import Job, wait_until

@pytest.fixture(scope="module")
def etcd(tmp_path_factory):
    from etcdcluster import ETCD, SecureEtcd
    if not os.access(ETCD, os.X_OK):
        pytest.skip(f"{ETCD} is not installed (Debian's etcd-server; .ci/install-etcd.sh)")
    member = SecureEtcd(str(tmp_path_factory.mktemp("secure-etcd")))
    try:
        yield member
    finally:
        member.close()


def test_etcdctl_variables_are_checked_before_anything_is_asked(tmp_path):
    assert parse("etcds://h1,h2:32379/p") == (["https://h1:2379", "https://h2:32379"], "/p")
    missing = str(tmp_path / "missing.pem")
    for env, said in (({"ETCDCTL_CACERT": missing}, f"ETCDCTL_CACERT={missing}: not a readable CA certificate "
                                                     f"(No such file or directory)"),
                      ({"ETCDCTL_CERT": missing}, f"ETCDCTL_CERT={missing}: not a readable certificate"),
                      ({"ETCDCTL_KEY": missing}, "ETCDCTL_KEY is set without ETCDCTL_CERT"),
                      ({"ETCDCTL_USER": "hvd"}, "ETCDCTL_USER names user 'hvd' without a password"),
                      ({"ETCDCTL_PASSWORD": "x"}, "ETCDCTL_PASSWORD is set without ETCDCTL_USER")):
        with pytest.raises(ValueError) as e:
            EtcdStore("etcds://h1", "/p", env=env)
        assert said in str(e.value)
    with pytest.raises(ValueError, match="ETCDCTL_CACERT is set, but etcd:// members speak plain HTTP"):
        EtcdStore("etcd://h1", "/p", env={"ETCDCTL_CACERT": missing})
    assert EtcdStore("etcd://h1", "/p", env={"ETCDCTL_USER": "hvd:pw"})._user == ("hvd", "pw")  # etcdctl's form


def test_a_driver_leads_through_tls_and_auth_while_a_standby_waits(etcd, tmp_path):
    """A lease held elsewhere: a driver is refused it, a standby waits, then takes the job over
    once it is released and runs it through etcd (lease, journal, release). The password reaches
    neither the workers' environment nor any output."""
    ckpt = str(tmp_path / "ckpt")
    held = EtcdStore(etcd.url, "/hvdlite" + ckpt, env=etcd.env)
    lease = held.acquire("elsewhere:1:2", 60)
    seen = tmp_path / "worker.env"
    run = ["--min-np", "1", "-np", "1", "--checkpoint-dir", ckpt, "--driver-store", etcd.url]
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with Job([*run, "--standby", "sh", "-c", f"env > {seen}"], tmp_path / "a", env=etcd.env) as standby:
        with Job([*run, "true"], tmp_path / "b", env=etcd.env) as refused:
            second = refused.finish(30)
        wait_until(lambda: "elsewhere:1:2 leads the job (lease 1)" in Job.read(standby.err), 30, "the wait")
        held.release(lease)
        r = standby.finish(60)
    assert second.code == 76 and "another driver runs the job" in second.stderr, second.stderr
    assert r.code == 0, r.stderr
    assert held.holder() is None and held.get("journal") is not None and held._read_lease()[1] == 2
    workers = seen.read_text()
    assert "ETCDCTL_CACERT=" in workers and "ETCDCTL_PASSWORD" not in workers and "ETCDCTL_USER" not in workers
    assert etcd.PASSWORD not in workers + r.stderr + r.stdout + second.stderr


def test_an_expired_token_is_replaced_and_the_lease_kept(etcd, request):
    store = EtcdStore(etcd.url, f"/hvdlite/{request.node.name}", env=etcd.env)
    lease = store.acquire("a", 60)
    store.put(lease, "journal", b"one")
    token = store._token
    assert token
    # etcd forgets a token left idle for its --auth-token-ttl (1 s here; it looks each second).
    # Asking whether it did would use it and keep it alive: wait, then check it did.
    time.sleep(2.5)
    status, said = etcd.call("/v3/kv/range", {"key": "Lw=="}, token)
    assert status == 401 and "invalid auth token" in said
    assert store.renew(lease, 60) and store._token not in (None, token)
    store.put(lease, "journal", b"two")
    assert store.get("journal") == b"two" and store.holder() == lease


# etcds:// with each variable in turn wrong (None: left out), and an etcd that does not answer:
# the exit code and what the driver's last line says. A standby ends too: waiting would not help.
BAD = {"wrong CA": ({"ETCDCTL_CACERT": "other-ca.pem"}, 1, "unable to get local issuer certificate: the member's "
                                                           "certificate does not verify with ETCDCTL_CACERT="),
       "wrong password, a standby": ({"ETCDCTL_PASSWORD": "not-it"}, 1, "etcdserver: authentication failed, invalid user ID "
                                                             "or password (user 'hvd'"),
       "no user": ({"ETCDCTL_USER": None, "ETCDCTL_PASSWORD": None}, 1, "etcdserver: permission denied: etcd has "
                                                                    "auth on; name its user in ETCDCTL_USER"),
       "no answer": ({}, 1, "no etcd member answered: https://127.0.0.1:1: [Errno 111] Connection refused")}


def test_bad_settings_end_the_driver_in_one_line(etcd, tmp_path, monkeypatch, capsys):
    """`hvdlite run` in this process (what a driver process runs, less its start): a traceback
    would fail the test as the exception it is."""
    for case, (change, code, said) in BAD.items():
        for name, value in {**etcd.env, **change}.items():
            if value is None:
                monkeypatch.delenv(name, raising=False)
            else:
                monkeypatch.setenv(name, etcd.path(value) if value.endswith(".pem") else value)
        url = "etcds://127.0.0.1:1" if case == "no answer" else etcd.url
        assert main(["run", "--min-np", "1", "--checkpoint-dir", str(tmp_path / case), "--driver-store", url,
                     *(["--standby"] if "standby" in case else []), "true"]) == code, case
        out, err = capsys.readouterr()
        assert said in err.strip().splitlines()[-1] and etcd.PASSWORD not in out + err, (case, err)


def test_an_unreadable_file_is_a_usage_error_naming_its_variable(etcd, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ETCDCTL_CERT", etcd.path("client.pem"))
    monkeypatch.setenv("ETCDCTL_KEY", etcd.path("nothing.pem"))
    code = main(["run", "--min-np", "1", "--checkpoint-dir", str(tmp_path), "--driver-store", etcd.url, "true"])
    err = capsys.readouterr().err
    assert code == 2 and err == (f"hvdlite run: error: --driver-store: ETCDCTL_CERT={etcd.path('client.pem')} and "
                                 f"ETCDCTL_KEY={etcd.path('nothing.pem')}: not a readable certificate and "
                                 f"unencrypted key (No such file or directory)\n")
