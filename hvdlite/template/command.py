"""Which worker commands a template can run, decided without processes.

A template is a running interpreter; it can stand in for `PYTHON script.py args` and
`PYTHON -m module args` (optionally with -u) when PYTHON is that same interpreter and the
environment variables read at startup (Python's; those torch and numpy read as they load) are
the ones it started with.
"""
import os
import re
import shutil

# Read before any user code runs, so a forked child cannot change them: by the interpreter, and
# by what the template's preload loads: OpenMP and MKL under torch, OpenBLAS under numpy (a
# worker's thread counts, which its numbers hang on), and torch itself (hundreds of settings as
# it loads: TORCH_COMPILE_DISABLE, TORCH_LOGS, PYTORCH_JIT...). Not TORCHELASTIC_*: a driver's own.
_STARTUP_NAMES = ("LANG", "LC_ALL", "LC_CTYPE")
_LOAD_TIME_PREFIXES = ("OMP_", "GOMP_", "KMP_", "MKL_", "OPENBLAS_", "GOTO_",
                       "TORCH_", "TORCHDYNAMO_", "TORCHINDUCTOR_", "PYTORCH_")
# A worker's own, applied after the fork: -u (child.py), and the thread count torch runs on (the
# boot's after_fork; hvdlite sets it per host, where it changes as workers join). A template
# starts without the count (template_env), so an unset one gets torch's default, as plainly.
THREADS = "OMP_NUM_THREADS"
_APPLIED_AFTER_FORK = ("PYTHONUNBUFFERED", THREADS)
_PYTHON_NAME = re.compile(r"python[0-9.]*$")


class Refused(Exception):
    """The template cannot run this command; a plain launch can."""


def resolve(program: str, env: dict, cwd: str):
    """The absolute path a plain launch of `program` would run, or None."""
    if os.sep in program:
        return os.path.abspath(os.path.join(cwd, program))
    found = shutil.which(program, path=env.get("PATH", os.defpath))
    return os.path.abspath(found) if found else None


def startup_env(env: dict) -> dict:
    return {k: v for k, v in env.items() if k not in _APPLIED_AFTER_FORK and (
        k.startswith("PYTHON") or k in _STARTUP_NAMES or k.startswith(_LOAD_TIME_PREFIXES))}


def python_name(program: str) -> bool:
    """Whether the program is named as a python interpreter is (`python3`, `/x/bin/python3.10`)."""
    return bool(_PYTHON_NAME.match(os.path.basename(program)))


def interpreter(argv, env: dict, cwd: str) -> str:
    """The python a template for this command must run on; Refused if it is none."""
    if not argv:
        raise Refused("empty command")
    path = resolve(argv[0], env, cwd)
    if path is None or not python_name(path):
        raise Refused(f"{argv[0]} is not a python interpreter")
    return path


def same_interpreter(path: str, executable: str) -> bool:
    """Same program in the same directory: a venv's python is a symlink to the base one but
    runs with the venv's packages, so the file alone does not tell."""
    if path == executable:
        return True
    try:
        return os.path.dirname(path) == os.path.dirname(executable) and os.path.samefile(path, executable)
    except OSError:
        return False


def plan(argv, env: dict, cwd: str, executable: str, started_env: dict):
    """(kind, target, args, unbuffered) for a template child: kind "path" runs the script
    `target` as __main__, "module" the module `target`. Refused with a reason otherwise."""
    path = interpreter(argv, env, cwd)
    if not same_interpreter(path, executable):
        raise Refused(f"{argv[0]} is another interpreter than the template's {executable}")
    mine, its = startup_env(env), startup_env(started_env)
    if mine != its:
        differ = sorted(k for k in {*mine, *its} if mine.get(k) != its.get(k))
        raise Refused(f"startup variables differ from the template's: {', '.join(differ)}")
    if not os.path.isdir(cwd):
        raise Refused(f"no directory {cwd}")
    rest, unbuffered = list(argv[1:]), False
    while rest and rest[0] == "-u":
        rest, unbuffered = rest[1:], True
    if not rest:
        raise Refused("an interactive interpreter")
    if rest[0] == "-m":
        if len(rest) < 2:
            raise Refused("-m without a module")
        return "module", rest[1], rest[2:], unbuffered
    if rest[0].startswith("-"):
        raise Refused(f"interpreter option {rest[0]}")
    return "path", rest[0], rest[1:], unbuffered
