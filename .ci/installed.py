"""Exit 0 when the running interpreter already has this checkout installed (editable) and every
requirement met: pyproject.toml's dependencies, those of the extras named by --extras, and the
requirements given as arguments. Exit 1 otherwise, or when anything cannot be checked.

.ci/setup.sh runs pip only on exit 1: pip's resolve alone takes 5-15 s per interpreter even
when there is nothing to install.

    python3 -E .ci/installed.py --extras test,ray
    .venv-pygloo/bin/python -E .ci/installed.py pygloo numpy cloudpickle
"""
import importlib.util
import os
import sys
from importlib import metadata

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

def wanted(argv):
    try:
        import tomllib
    except ImportError:  # Python < 3.11: pip's own copy (pip is there: setup.sh runs it next)
        from pip._vendor import tomli as tomllib
    extras = []
    if argv[:1] == ["--extras"]:
        extras, argv = argv[1].split(","), argv[2:]
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    return [*project["dependencies"], *(r for e in extras for r in project["optional-dependencies"][e]), *argv]


def this_checkout():
    """hvdlite is installed and imports from this very directory (run with -E: no PYTHONPATH)."""
    metadata.distribution("hvdlite")  # raises when not installed
    spec = importlib.util.find_spec("hvdlite")
    return spec is not None and os.path.samefile(os.path.dirname(os.path.dirname(spec.origin)), ROOT)


def met(text):
    try:
        from packaging.requirements import Requirement
    except ImportError:
        from pip._vendor.packaging.requirements import Requirement
    requirement = Requirement(text)
    if requirement.marker is not None and not requirement.marker.evaluate():
        return True
    try:
        version = metadata.version(requirement.name)
    except metadata.PackageNotFoundError:
        return False
    return requirement.specifier.contains(version, prereleases=True)


def main():
    try:
        ok = this_checkout() and all(met(r) for r in wanted(sys.argv[1:]))
    except Exception as e:  # noqa: BLE001 -- anything unexpected: let pip decide
        print(f"installed.py: {type(e).__name__}: {e}", file=sys.stderr)
        ok = False
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
