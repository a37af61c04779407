"""Kept ("warm") templates: a template that outlives its job (`hvdlite run --keep-warm S`), so
that the next job's workers fork from it instead of importing torch again.

It listens on a unix socket at a per-user path named by what it can serve (interpreter,
preload list, Python startup environment), in a directory only this user may enter. The
directory is refused, never used, when another user owns it or others may enter it. The kept
template refuses spawns and leaves once a module it preloaded changed on disk.
"""
import hashlib
import json
import os
import stat
import sys


def runtime_dir(env: dict, uid: int) -> str:
    return os.path.join(env.get("XDG_RUNTIME_DIR") or "/tmp", f"hvdlite-{uid}")


def identity(python: str, preload, startup: dict) -> str:
    """What a kept template can serve; equal identities may share one. The path as given
    too: a venv's python is a symlink to the base one but has other packages."""
    text = json.dumps([os.path.abspath(python), os.path.realpath(python), list(preload),
                       sorted(startup.items())])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def socket_path(folder: str, ident: str) -> str:
    return os.path.join(folder, f"warm-{ident}.sock")


def dir_problem(st: os.stat_result, uid: int):
    """None if a directory with this lstat may hold our sockets, else why not."""
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if st.st_uid != uid:
        return f"belongs to uid {st.st_uid}, not {uid}"
    if st.st_mode & 0o077:
        return f"is open to others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def private_dir(folder: str, uid: int):
    """Create `folder` 0700 if missing; None if it is fit for use, else one line why not."""
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:
        pass
    except OSError as e:
        return f"cannot create {folder}: {e.strerror}"
    try:
        problem = dir_problem(os.lstat(folder), uid)
    except OSError as e:
        return f"{folder}: {e.strerror}"
    return f"{folder} {problem}" if problem else None


def _stamp(path: str):
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size, st.st_ino


def module_stamps() -> dict:
    """The files of every loaded module, with what says they changed."""
    files = {}
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if isinstance(path, str) and path not in files:
            files[path] = _stamp(path)
    return files


def first_changed(stamps: dict):
    """A loaded module file that changed (or went) since `stamps` were taken, or None."""
    for path, was in stamps.items():
        if _stamp(path) != was:
            return path
    return None
