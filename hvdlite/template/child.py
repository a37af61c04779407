"""A forked template child turning into the worker a plain launch would have started."""
import ctypes
import importlib.util
import io
import os
import runpy
import shlex
import signal
import sys
import types
import zipfile

PR_SET_PDEATHSIG = 1


def detach(template_pid: int, ready_fd: int) -> None:
    """First thing after fork: own session and process group (so the driver's killpg reaches
    the worker and what it spawns), death with the template (nobody else could report the
    worker's exit status), then tell the template, which only then reports the pid."""
    os.setsid()
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != template_pid:  # the template died before the line above
        os.kill(os.getpid(), signal.SIGKILL)
    os.write(ready_fd, b"x")
    os.close(ready_fd)


def _stream(fd: int, mode: str, unbuffered: bool, **text) -> io.TextIOWrapper:
    # As the interpreter builds its standard streams at startup (-u: no buffer at all).
    raw = io.FileIO(fd, mode, closefd=False)
    buffered = raw if unbuffered and mode == "wb" else \
        (io.BufferedWriter(raw) if mode == "wb" else io.BufferedReader(raw))
    return io.TextIOWrapper(buffered, write_through=unbuffered and mode == "wb", **text)


def become_worker(stdout_fd: int, stderr_fd: int, env: dict, cwd: str, unbuffered: bool) -> None:
    """Standard streams, environment and directory as a plain launch gives them; every other
    descriptor closed, as subprocess does."""
    null = os.open(os.devnull, os.O_RDONLY)
    for fd, target in ((null, 0), (stdout_fd, 1), (stderr_fd, 2)):
        os.dup2(fd, target)
    for fd in [int(name) for name in os.listdir("/proc/self/fd")]:
        if fd > 2:
            try:
                os.close(fd)
            except OSError:  # the listing's own descriptor, closed already
                pass
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    unbuffered = unbuffered or bool(env.get("PYTHONUNBUFFERED"))
    encoding, errors = sys.stdout.encoding, sys.stdout.errors
    sys.stdin = sys.__stdin__ = _stream(0, "rb", False, encoding=encoding, errors=sys.stdin.errors)
    sys.stdout = sys.__stdout__ = _stream(1, "wb", unbuffered, encoding=encoding, errors=errors,
                                          line_buffering=os.isatty(1))
    sys.stderr = sys.__stderr__ = _stream(2, "wb", unbuffered, encoding=encoding,
                                          errors="backslashreplace", line_buffering=True)
    # The template's random state is every child's: reseed what is seeded once per process
    # (`random` reseeds itself after fork). The hash seed stays the template's.
    if "numpy.random" in sys.modules:
        sys.modules["numpy.random"].seed()


def prepare_title() -> None:
    """In the template, before any fork: setproctitle finds the memory ps reads only while the
    process's environment is the one it started with (a child replaces it)."""
    try:
        import setproctitle
    except ImportError:
        return
    setproctitle.getproctitle()


def show_as(words, name: str) -> None:
    """Make `ps` show the forked worker's own command line, not the template's (`ps | grep
    train.py` finds it): setproctitle rewrites it; without it only the process name changes."""
    try:
        import setproctitle
    except ImportError:
        try:
            with open("/proc/self/comm", "w") as f:
                f.write(name[:15])  # the kernel keeps 15 bytes
        except OSError:
            pass
        return
    setproctitle.setproctitle(shlex.join(words))


def _run_file(target: str, main) -> None:
    """Run a script file in `main` as `python FILE` does; a directory or zip archive runs
    the __main__ module inside it, as `python DIR` does."""
    if os.path.isdir(target) or zipfile.is_zipfile(target):
        sys.path.insert(0, target)
        runpy._run_module_as_main("__main__", alter_argv=False)
        return
    with io.open_code(target) as f:
        code = compile(f.read(), target, "exec")
    main.__dict__.update(__file__=target, __cached__=None, __loader__=None, __package__=None, __spec__=None)
    exec(code, main.__dict__)


def run(kind: str, target: str, args, program: str) -> None:
    """Run the training command as __main__; errors end the process as the interpreter
    would end it, with the traceback starting at the user's code. The script's module stays
    __main__ after it returns or raises, as the interpreter's does: exit work (rank 0's last
    checkpoint) may pickle a class the script defined, which pickle looks up there (runpy's
    run_path and run_module would put the template's __main__ back)."""
    template_main = sys.modules["__main__"]  # noqa: F841  held: its functions' globals are still on the stack
    main = sys.modules["__main__"] = types.ModuleType("__main__")
    if kind == "path":
        if not os.path.exists(target):
            sys.stderr.write(f"{program}: can't open file {os.path.abspath(target)!r}: "
                             "[Errno 2] No such file or directory\n")
            sys.exit(2)
        if not getattr(sys.flags, "safe_path", False):
            sys.path[0] = os.path.dirname(os.path.realpath(target))
        sys.argv = [target] + list(args)
        # Python 3.9+ runs a script under its absolute name (the directory joined, not
        # normalised), its __file__ and tracebacks; argv[0] stays as given.
        named = os.path.join(os.getcwd(), target) if sys.version_info >= (3, 9) else target
        runner = lambda: _run_file(named, main)  # noqa: E731
    else:
        if not getattr(sys.flags, "safe_path", False):
            sys.path[0] = os.getcwd()
        sys.argv = ["-m"] + list(args)
        try:
            found = importlib.util.find_spec(target) is not None
        except ImportError:
            found = False
        if not found:
            sys.stderr.write(f"{program}: No module named {target}\n")
            sys.exit(1)
        runner = lambda: runpy._run_module_as_main(target)  # noqa: E731  what `python -m` runs, in sys.modules["__main__"]
    show_as([program] + ([target] if kind == "path" else ["-m", target]) + list(args), os.path.basename(target))
    try:
        runner()
    except Exception:
        etype, value, tb = sys.exc_info()
        ours = (run.__code__.co_filename, runpy.run_path.__code__.co_filename)  # runpy may be frozen
        while tb is not None and tb.tb_frame.f_code.co_filename in ours:
            tb = tb.tb_next
        sys.excepthook(etype, value.with_traceback(tb), tb)
        sys.exit(1)
