"""Horovod's public torch API, read from its sources: every public name of horovod.torch and
horovod.torch.elastic with its parameters (kind and default, as written), and the public methods
of the public classes (and of the optimizer DistributedOptimizer returns).

    python3 tests/horovod_api.py HOROVOD_CHECKOUT > tests/horovod_api.json

writes what tests/test_parity.py compares hvdlite against; HOROVOD_CHECKOUT is a Horovod
0.28.1 checkout (or unpacked sdist). Only the sources are parsed: nothing of Horovod is imported.
"""
import ast
import json
import os
import sys

PACKAGES = {"": "horovod.torch", "elastic.": "horovod.torch.elastic"}
# Names horovod/torch/__init__.py imports for its own use, not for its users.
NOT_API = {"check_extension"}
# The classes DistributedOptimizer's result is built from (their methods become its methods).
OPTIMIZER_CLASSES = ("_DistributedOptimizer", "_DistributedAdasumOptimizer")


class Sources:
    def __init__(self, root):
        self.root, self._trees = root, {}

    def _path(self, dotted):
        base = os.path.join(self.root, *dotted.split("."))
        return base + ".py" if os.path.exists(base + ".py") else os.path.join(base, "__init__.py")

    def _is_module(self, dotted):
        return os.path.exists(self._path(dotted))

    def module(self, dotted):
        if dotted not in self._trees:
            with open(self._path(dotted)) as f:
                self._trees[dotted] = ast.parse(f.read())
        return self._trees[dotted]

    def definition(self, dotted, name):
        """(module, node) defining `name` as seen from module `dotted`, following imports and
        assignments; node None for a name that is not a def or class (a constant)."""
        for node in reversed(list(_statements(self.module(dotted)))):  # the last binding wins
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name:
                return dotted, node
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("horovod"):
                for alias in node.names:
                    if (alias.asname or alias.name) == name:
                        if self._is_module(f"{node.module}.{alias.name}"):
                            return node.module, None
                        return self.definition(node.module, alias.name)
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
                value = node.value
                if isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name):
                    return self._instance_method(dotted, value.value.id, value.attr)
                if isinstance(value, ast.Name):
                    return self.definition(dotted, value.id)
                return dotted, None
        raise LookupError(f"{name} not found in {dotted}")

    def _instance_method(self, dotted, instance, method):
        """`method` of the class whose instance module `dotted` binds to `instance` (None for
        an attribute that is not a method)."""
        _, assign = next((dotted, n) for n in self.module(dotted).body if isinstance(n, ast.Assign)
                         and any(getattr(t, "id", None) == instance for t in n.targets))
        cls_module, cls = self.definition(dotted, assign.value.func.id)
        return cls_module, self.methods(cls_module, cls).get(method)

    def methods(self, dotted, cls):
        """Every method of the class, its Horovod bases' first (bases outside Horovod skipped)."""
        found = {}
        for base in cls.bases:
            if isinstance(base, ast.Name):
                try:
                    base_module, base_cls = self.definition(dotted, base.id)
                except LookupError:
                    continue
                found.update(self.methods(base_module, base_cls))
        found.update({n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)})
        return found


def _statements(tree):
    """The module's top-level statements, those under a top-level `if` or `try` included."""
    for node in tree.body:
        if isinstance(node, (ast.If, ast.Try)):
            for block in (node.body, node.orelse, getattr(node, "finalbody", [])):
                yield from _statements(ast.Module(body=block))
        else:
            yield node


def _wrapped(node):
    """The call a `def f(*args, **kwargs)` passes everything on to, if it is one."""
    a = node.args
    if a.args or a.kwonlyargs or not (a.vararg and a.kwarg):
        return None
    for call in ast.walk(node):
        if isinstance(call, ast.Call) and any(isinstance(x, ast.Starred) for x in call.args):
            return call.func
    return None


def parameters(node, drop_self=False):
    """[name, kind, default source or None] per parameter, in order."""
    a = node.args
    positional = a.posonlyargs + a.args
    defaults = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
    out = [[p.arg, "POSITIONAL_OR_KEYWORD", d and ast.unparse(d)] for p, d in zip(positional, defaults)]
    if drop_self and not any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in node.decorator_list):
        out = out[1:]
    if a.vararg:
        out.append([a.vararg.arg, "VAR_POSITIONAL", None])
    out += [[p.arg, "KEYWORD_ONLY", d and ast.unparse(d)] for p, d in zip(a.kwonlyargs, a.kw_defaults)]
    if a.kwarg:
        out.append([a.kwarg.arg, "VAR_KEYWORD", None])
    return out


def _class_attributes(cls):
    return [t.id for n in cls.body if isinstance(n, ast.Assign) for t in n.targets
            if isinstance(t, ast.Name) and not t.id.startswith("_")]


def _public(methods):
    return {name: node for name, node in methods.items() if not name.startswith("_")}


def public_names(tree):
    """The module's __all__, else every name it imports or defines (its imports under an `if`
    included) that has no leading underscore."""
    names = []
    for node in _statements(tree):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return [ast.literal_eval(e) for e in node.value.elts]
        if isinstance(node, ast.ImportFrom):
            names += [a.asname or a.name for a in node.names]
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.append(node.name)
    return sorted({n for n in names if not n.startswith("_") and n not in NOT_API})


def api(root):
    sources, out = Sources(root), {}
    for prefix, package in PACKAGES.items():
        for name in public_names(sources.module(package)):
            dotted, found = sources.definition(package, name)
            if isinstance(found, ast.FunctionDef):
                wrapped = _wrapped(found)
                if isinstance(wrapped, ast.Attribute) and isinstance(wrapped.value, ast.Name):
                    dotted, found = sources._instance_method(dotted, wrapped.value.id, wrapped.attr)
                out[prefix + name] = parameters(found, drop_self=dotted == "horovod.common.basics")
            elif isinstance(found, ast.ClassDef):
                methods = sources.methods(dotted, found)
                init = methods.get("__init__")
                out[prefix + name] = init and parameters(init, drop_self=True)
                for method, m in _public(methods).items():
                    out[f"{prefix}{name}.{method}"] = parameters(m)
                for attribute in _class_attributes(found):
                    out[f"{prefix}{name}.{attribute}"] = None
            else:
                out[prefix + name] = None  # a constant or module: it must exist
    for cls_name in OPTIMIZER_CLASSES:
        dotted, cls = sources.definition("horovod.torch.optimizer", cls_name)
        for method, m in _public(sources.methods(dotted, cls)).items():
            out.setdefault(f"DistributedOptimizer().{method}", parameters(m, drop_self=True))
    return out


if __name__ == "__main__":
    entries = sorted(api(sys.argv[1]).items())
    print("{\n" + ",\n".join(f" {json.dumps(k)}: {json.dumps(v)}" for k, v in entries) + "\n}")
