"""The documentation: the README stays short and runnable, the MkDocs site builds with warnings
as errors, and its front page renders to real content in headless Chromium."""
import os
import re
import shutil
import struct
import subprocess
import sys
import zlib
from collections import Counter

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
TEST_COMMAND = "bash .ci/setup.sh && python3 -m pytest -q tests"
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


def png_pixels(path):
    """The RGB(A) pixels of an 8-bit PNG as a list of tuples, its row filters undone."""
    data = read_bytes(path)
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat = 8, b""
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, color = struct.unpack(">IIBB", body[:10])
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    assert depth == 8 and color in (2, 6), (depth, color)
    bpp = 3 if color == 2 else 4
    raw, stride, rows, prev = zlib.decompress(idat), width * bpp, [], bytearray(width * bpp)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if kind == 1:
                line[i] = (line[i] + a) & 255
            elif kind == 2:
                line[i] = (line[i] + b) & 255
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(line)
        prev = line
    return [tuple(row[i:i + 3]) for row in rows for i in range(0, stride, bpp)]


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


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
    pixels = png_pixels(shot)
    background, count = Counter(pixels).most_common(1)[0]
    assert len(pixels) == 1280 * 1000
    # Real content: a fair share of the page is not background (text, the blue header, the
    # table), in many colours (anti-aliased text), and the header's blue is there.
    assert len(pixels) - count > 0.10 * len(pixels)
    assert len(set(pixels)) > 200
    assert sum(1 for r_, g, b in pixels[:1280 * 100] if b > 150 and r_ < 120) > 50_000
