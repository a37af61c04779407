"""The documentation: the README stays short and runnable, the MkDocs site builds with warnings
as errors, and its front page renders to real content in headless Chromium."""
import os
import re
import shutil
import subprocess
import sys
from collections import Counter

import pytest

from pngs import png_pixels

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
TEST_COMMAND = "bash .ci/setup.sh && python3 -m pytest -q -n 3 --dist loadgroup tests"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def test_readme_is_short_and_its_commands_are_the_ones_ci_runs():
    text = read(README)
    assert len(text.splitlines()) <= 120
    commands = re.search(r"```bash\n(.*?)```", text, re.S).group(1)
    assert TEST_COMMAND in commands.splitlines()
    assert TEST_COMMAND in read(os.path.join(ROOT, ".ci", "run")).splitlines()


def test_every_file_the_readme_names_exists():
    text = read(README)
    named = set(re.findall(r"\]\(((?:docs|examples)/[^)#]*)", text))
    named |= set(re.findall(r"\b(examples/[\w./-]+\.(?:py|sh))", text))
    assert "examples/train_numpy.py" in named
    missing = [p for p in sorted(named) if not os.path.exists(os.path.join(ROOT, p))]
    assert not missing


def mkdocs_build(config, site_dir):
    pytest.importorskip("mkdocs", reason="mkdocs is not installed: pip install -e '.[test]'")
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", config,
                           "-d", str(site_dir)], capture_output=True, text=True, timeout=120)


def test_site_builds_with_warnings_as_errors(tmp_path):
    r = mkdocs_build(os.path.join(ROOT, "mkdocs.yml"), tmp_path / "site")
    assert r.returncode == 0, r.stderr
    for page in ("index", "elastic", "troubleshooting", "horovod-differences", "signals"):
        assert (tmp_path / "site" / ("" if page == "index" else page) / "index.html").exists()


@pytest.mark.parametrize("link", ["[x](no-such-page.md)", "[x](elastic.md#no-such-section)"])
def test_a_broken_link_fails_the_build(tmp_path, link):
    shutil.copytree(os.path.join(ROOT, "docs"), tmp_path / "docs")
    shutil.copy(os.path.join(ROOT, "mkdocs.yml"), tmp_path / "mkdocs.yml")
    with open(tmp_path / "docs" / "index.md", "a") as f:
        f.write(f"\nSee {link}.\n")
    r = mkdocs_build(str(tmp_path / "mkdocs.yml"), tmp_path / "site")
    assert r.returncode != 0
    assert "no-such" in r.stderr


def chromium(tmp_path, *args):
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("no chromium on PATH: .ci/setup.sh installs Debian's `chromium` when run as root")
    return subprocess.run([browser, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}", *args],
                          capture_output=True, text=True, timeout=120)


def test_front_page_renders_in_headless_chromium(tmp_path):
    r = mkdocs_build(os.path.join(ROOT, "mkdocs.yml"), tmp_path / "site")
    assert r.returncode == 0, r.stderr
    page = "file://" + str(tmp_path / "site" / "index.html")
    dom = chromium(tmp_path, "--dump-dom", page)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert re.search(r"<title>hvdlite</title>", dom.stdout)
    assert re.search(r"<h1[^>]*>hvdlite", dom.stdout)
    assert "Why hvdlite" in dom.stdout and 'href="elastic/"' in dom.stdout
    shot = tmp_path / "front.png"
    r = chromium(tmp_path, "--window-size=1280,1000", f"--screenshot={shot}", page)
    assert r.returncode == 0 and shot.exists(), r.stderr[-2000:]
    if os.environ.get("HVDLITE_KEEP_SCREENSHOT"):
        shutil.copy(shot, os.environ["HVDLITE_KEEP_SCREENSHOT"])
    _, _, rows = png_pixels(shot)
    pixels = [p for row in rows for p in row]
    background, count = Counter(pixels).most_common(1)[0]
    assert len(pixels) == 1280 * 1000
    # Real content: a fair share of the page is not background (text, the blue header, the
    # table), in many colours (anti-aliased text), and the header's blue is there.
    assert len(pixels) - count > 0.10 * len(pixels)
    assert len(set(pixels)) > 200
    assert sum(1 for r_, g, b in pixels[:1280 * 100] if b > 150 and r_ < 120) > 50_000
