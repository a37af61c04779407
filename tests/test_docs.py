"""The documentation: the README stays short and runnable, the MkDocs site builds with warnings
as errors, and its front page renders to real content in headless Chromium."""
import ast
import glob
import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
from collections import Counter

import pytest

from pngs import png_pixels

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
PAGES = [README] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
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


def test_getting_started_gives_the_readmes_test_command():
    assert TEST_COMMAND in read(os.path.join(ROOT, "docs", "getting-started.md")).splitlines()


def test_the_readme_claims_the_api_no_further_than_the_differences_page_allows():
    # "one changed line" has exceptions (docs/horovod-differences.md): every page that says it
    # links them in the same paragraph or table row.
    for page in PAGES:
        for paragraph in re.split(r"\n\s*\n|\n(?=[-|] )", read(page)):
            if "one changed line" in paragraph:
                assert "horovod-differences.md" in paragraph, (page, paragraph)


def test_the_exit_codes_are_one_table_in_the_docs_the_help_and_the_code():
    from hvdlite import exitcodes
    from hvdlite.cli import build_parser
    rows = [tuple(cell.strip() for cell in line.strip("|").split("|"))
            for line in read(os.path.join(ROOT, "docs", "signals.md")).splitlines()
            if re.match(r"\| [^|]+ \| (driver|worker) \|", line)]
    assert rows == [tuple(row) for row in exitcodes.TABLE]
    help_text = " ".join(build_parser().format_help().split())
    for code, who, meaning in exitcodes.TABLE:
        assert f"{who} {code} {meaning}" in help_text
    for page in PAGES:  # one place: the other pages link to it
        if not page.endswith("signals.md"):
            assert not re.search(r"^\| (75|128 ?\+ ?N) \|", read(page), re.M), page


def fenced(text):
    """(language, code) of every fenced block."""
    language, lines = None, []
    for line in text.splitlines():
        if line.strip().startswith("```"):
            if language is None:
                language, lines = line.strip()[3:].strip(), []
            else:
                yield language, "\n".join(lines)
                language = None
        elif language is not None:
            lines.append(line)


def documented_commands(program):
    """Every `hvdlite PROGRAM ...` command of the bash blocks of the README and the docs, as
    its words after PROGRAM (a `...` standing for more flags is left out)."""
    for page in PAGES:
        for language, code in fenced(read(page)):
            if language not in ("bash", "sh"):
                continue
            for line in code.replace("\\\n", " ").splitlines():
                words = shlex.split(line, comments=True)
                command = []
                for word in words + ["&&"]:
                    if word not in ("&&", "||", "|", ";"):
                        command.append(word)
                        continue
                    while command and (command[0] == "exec" or re.match(r"[A-Z_]+=", command[0])):
                        command.pop(0)
                    if command[:2] == ["hvdlite", program]:
                        yield os.path.basename(page), [w for w in command[2:] if w != "..."]
                    command = []


def test_every_documented_run_command_parses_with_hvdlites_own_flags_before_the_script():
    from hvdlite.cli import build_parser, flags_after_command
    commands = list(documented_commands("run"))
    assert len(commands) >= 20
    for page, words in commands:
        parser = build_parser()
        args = parser.parse_args(words)
        if not args.command:  # flags only, their `...` left out: they parse before a command
            args = parser.parse_args(words + ["true"])
        assert flags_after_command(parser, args.command) == [], (page, words)


def test_every_documented_timeline_command_parses_and_its_exit_codes_are_the_documented_ones(tmp_path, capsys):
    from hvdlite.timeline.command import build_parser, main
    commands = list(documented_commands("timeline"))
    assert commands
    for page, words in commands:
        build_parser().parse_args(words)
    assert main([str(tmp_path / "missing.jsonl"), "-o", str(tmp_path / "t.html")]) == 1  # its input
    (tmp_path / "bad.jsonl").write_text("not json\n{}\n")
    assert main([str(tmp_path / "bad.jsonl"), "-o", str(tmp_path / "t.html")]) == 1
    assert main([str(tmp_path / "missing.jsonl")]) == 2  # its flags: no -o
    assert "hvdlite timeline exits 0, 1 when its input cannot be read or drawn" in \
        " ".join(read(os.path.join(ROOT, "docs", "signals.md")).replace("`", "").split())


def test_every_python_snippet_of_the_docs_is_python():
    snippets = [(page, code) for page in PAGES for language, code in fenced(read(page)) if language == "python"]
    assert len(snippets) >= 10
    for page, code in snippets:
        ast.parse(textwrap.dedent(code), filename=page)


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
