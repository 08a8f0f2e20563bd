"""The graphd package's modules import one another as layers: no import
cycle, not even through an import statement inside a function.

The graph is read from the source with `ast`, without importing anything
but the package's location. Its nodes are graphd's own modules (a
package is its __init__). Every import statement counts, wherever it is
(module level, inside a function, a class, an `if` or a `try`), and so does
importlib.import_module() or __import__() of a constant name. An edge goes
from the importing module to:

  - `import graphd.a.b`: the module graphd.a.b;
  - `from graphd.a import n` (relative forms resolved first): the module
    graphd.a.n when n is a submodule, else graphd.a, whose namespace n
    comes from; `from . import n` naming a submodule is thus an edge to
    that submodule only (Python imports graphd.a.n there without waiting
    for graphd.a's __init__, exactly as for `import graphd.a.n`; counting
    it as a use of that __init__ would make every package whose __init__
    re-exports its submodules look circular);
  - in both cases also every package on the way down to the imported
    module that the importer is not inside itself: importing
    graphd.warp._core from graphd.jax runs graphd/warp/__init__ first,
    whereas from graphd.warp._replay it does not (Python began running
    graphd.warp before _replay). The top package graphd is therefore
    never such an implicit target: every module is inside it. Its
    __init__ importing its submodules is the facade on top, not a cycle.

A strongly connected set of more than one module is a cycle; the test
fails naming each one and the import lines that close it."""

import ast
import os
import unittest


def package_dir():
    """The graphd package the tests import (the source tree, or the
    installed wheel under GRAPHD_TEST_INSTALLED=1)."""
    import graphd
    return os.path.dirname(os.path.abspath(graphd.__file__))


def modules(root, name="graphd"):
    """{module name: (path, is_package)} of every .py file under root."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        rel = os.path.relpath(dirpath, root)
        parts = [name] + ([] if rel == "." else rel.split(os.sep))
        if "__init__.py" not in filenames:
            continue
        for f in sorted(filenames):
            if not f.endswith(".py"):
                continue
            if f == "__init__.py":
                out[".".join(parts)] = (os.path.join(dirpath, f), True)
            else:
                out[".".join(parts + [f[:-3]])] = (os.path.join(dirpath, f), False)
    return out


def parse(path):
    with open(path, encoding="utf-8") as f:
        return ast.parse(f.read(), path)


def _imported(node, importer, is_package, known):
    """The graphd modules one import node names (before implicit packages)."""
    out = []
    if isinstance(node, ast.Import):
        for a in node.names:
            out.append(a.name)
    elif isinstance(node, ast.ImportFrom):
        if node.level:
            base = importer.split(".")
            if not is_package:
                base = base[:-1]
            base = base[:len(base) - (node.level - 1)]
            if node.module:
                base = base + node.module.split(".")
            base = ".".join(base)
        else:
            base = node.module or ""
        for a in node.names:
            sub = f"{base}.{a.name}"
            out.append(sub if sub in known else base)
    elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
            and isinstance(node.args[0].value, str):
        f = node.func
        called = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
        if called in ("import_module", "__import__"):
            out.append(node.args[0].value)
    return [m for m in out if m == "graphd" or m.startswith("graphd.")]


def import_graph(root):
    """{importer: {imported: [line, ...]}} over graphd's own modules."""
    known = modules(root)
    graph = {m: {} for m in known}
    for importer, (path, is_package) in known.items():
        for node in ast.walk(parse(path)):
            for target in _imported(node, importer, is_package, known):
                # The longest prefix that is a module: `import graphd.x.Name`
                # is not valid Python, but a typo should not hide an edge.
                while target not in known and "." in target:
                    target = target.rsplit(".", 1)[0]
                parts = target.split(".")
                targets = [target] + [".".join(parts[:k]) for k in range(1, len(parts))]
                for t in targets:
                    if t == importer:
                        continue
                    if t != target and (importer == t or importer.startswith(t + ".")):
                        continue  # a package the importer is inside: already running
                    lines = graph[importer].setdefault(t, [])
                    if node.lineno not in lines:
                        lines.append(node.lineno)
    return graph


def cycles(graph):
    """The strongly connected sets of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = []
            while True:
                w = stack.pop()
                on.discard(w)
                scc.append(w)
                if w == v:
                    break
            if len(scc) > 1:
                out.append(sorted(scc))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def describe(graph, scc, root):
    """The edges inside one cycle, with the file and line of each import."""
    members = set(scc)
    known = modules(root)
    lines = [" <-> ".join(scc) + ":"]
    for a in scc:
        path = os.path.relpath(known[a][0], os.path.dirname(root))
        for b in sorted(graph[a]):
            if b in members:
                where = ", ".join(str(n) for n in sorted(graph[a][b]))
                lines.append(f"    {a} -> {b}  ({path}:{where})")
    return "\n".join(lines)


class ImportGraphTest(unittest.TestCase):
    def test_no_import_cycle_among_graphd_modules(self):
        root = package_dir()
        graph = import_graph(root)
        found = cycles(graph)
        if found:
            self.fail("import cycles in the graphd package (every import counts, those inside functions too; "
                      "move what both sides need to a module below them):\n"
                      + "\n".join(describe(graph, c, root) for c in found))

    def test_the_graph_sees_every_kind_of_import(self):
        # The reader itself, on a package made for it: a cycle through an
        # import inside a function, through `from . import name` of a
        # package's attribute, and through importlib, is found; a
        # submodule imported by its package's __init__ is not a cycle.
        import tempfile
        with tempfile.TemporaryDirectory() as tmp:
            pkg = os.path.join(tmp, "graphd")
            os.makedirs(os.path.join(pkg, "sub"))
            files = {
                "__init__.py": "from . import low\nfrom .sub import a\n",
                "low.py": "import os\n",
                "sub/__init__.py": "from .a import thing\n",
                "sub/a.py": "from ..low import x\ndef f():\n    from . import b\n",
                "sub/b.py": "from .. import low\ndef g():\n    from .a import thing\n",
                "c.py": "import importlib\ndef h():\n    importlib.import_module('graphd.d')\n",
                "d.py": "def k():\n    from . import c\n",
                "e.py": "from .sub import a\n",
                "f.py": "def m():\n    from . import e\n",
            }
            for name, text in files.items():
                with open(os.path.join(pkg, name), "w", encoding="utf-8") as f:
                    f.write(text)
            graph = import_graph(pkg)
            self.assertEqual(sorted(graph["graphd.e"]), ["graphd.sub", "graphd.sub.a"])
            self.assertEqual(cycles(graph), [["graphd.c", "graphd.d"], ["graphd.sub.a", "graphd.sub.b"]])
            # A package's attribute taken back from inside it closes a cycle.
            with open(os.path.join(pkg, "sub/a.py"), "w", encoding="utf-8") as f:
                f.write("def f():\n    from . import thing\n")
            with open(os.path.join(pkg, "sub/b.py"), "w", encoding="utf-8") as f:
                f.write("\n")
            self.assertEqual(cycles(import_graph(pkg)), [["graphd.c", "graphd.d"], ["graphd.sub", "graphd.sub.a"]])


if __name__ == "__main__":
    unittest.main()
