import pytest

from hvdlite.discovery.hostspec import HostSpecError, parse_discovery_output, parse_hostfile, parse_hosts


def test_parse_hosts():
    assert parse_hosts("h1:2,h2:4,h3") == [("h1", 2), ("h2", 4), ("h3", 1)]
    assert parse_hosts("h1:2,h1:5") == [("h1", 2)]


@pytest.mark.parametrize("spec", ["h1:0", "h1:-1", "h1:x", "h1:2,,h2:1", ":2", "h 1:2", "h1:"])
def test_parse_hosts_rejects(spec):
    with pytest.raises(HostSpecError):
        parse_hosts(spec)


def test_hostfile(tmp_path):
    f = tmp_path / "hosts"
    f.write_text("# cluster\nh1 slots=2\n\nh2 slots=4  # big one\nh3\n")
    assert parse_hostfile(str(f)) == [("h1", 2), ("h2", 4), ("h3", 1)]


@pytest.mark.parametrize("text", ["h1 slots=0\n", "h1 slots=two\n", "h1 2\n", "# nothing\n", "h1 slots=1 x\n"])
def test_hostfile_rejects(tmp_path, text):
    f = tmp_path / "hosts"
    f.write_text(text)
    with pytest.raises(HostSpecError):
        parse_hostfile(str(f))


def test_hostfile_missing(tmp_path):
    with pytest.raises(HostSpecError, match="cannot read"):
        parse_hostfile(str(tmp_path / "nope"))


def test_discovery_output():
    assert parse_discovery_output("a:2\n\nb:1\na:2\n  c:3  \n") == [("a", 2), ("b", 1), ("c", 3)]
    assert parse_discovery_output("a\nb:3\n", default_slots=2) == [("a", 2), ("b", 3)]
    assert parse_discovery_output("") == []


@pytest.mark.parametrize("text", ["a:-1\n", "a:x\n", "a b c\n", "a\n", "\x00:2\n"])
def test_discovery_output_rejects(text):
    with pytest.raises(HostSpecError):
        parse_discovery_output(text)
