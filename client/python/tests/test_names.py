"""No name in the graphd package shadows a Python builtin: no module-level
name (a function, class, assignment or import), no parameter of a function
or lambda, and no local name inside a function (an assignment, a loop or
`with` target, an `except ... as`, a nested def or import) is one of
builtins' public names (`callable`, `id`, `type`, `input`, `bytes`, `len`,
`format`, `all`, ...). Read from the source with `ast`.

The old spellings graphd.jax.callable and graphd.warp.callable are kept
through a module __getattr__, not as globals, so they need no exception
here. The exceptions below are keywords that callers pass by name."""

import ast
import builtins
import inspect
import unittest

from test_imports import modules, package_dir, parse

BUILTINS = frozenset(n for n in dir(builtins) if not n.startswith("_"))

# (module, function, parameter): why the name stays.
ALLOWED = {
    ("graphd.warp._install", "clear_jax_callable_graph_cache", "callable"):
        "Warp's keyword: install() puts this function in place of Warp's, whose callers pass callable=",
    ("graphd.client", "Client.evict", "all"):
        "the selector graphd_evict_options.all (graphctl evict --all), passed as all=True",
}


def _targets(node):
    """The names a statement or expression binds in its own scope."""
    out = []
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        out.append(node.name)
    elif isinstance(node, (ast.Import, ast.ImportFrom)):
        out += [(a.asname or a.name).split(".")[0] for a in node.names if a.name != "*"]
    elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
        out.append(node.id)
    elif isinstance(node, ast.ExceptHandler) and node.name:
        out.append(node.name)
    return out


def _params(fn):
    a = fn.args
    return [p.arg for p in a.posonlyargs + a.args + a.kwonlyargs + [x for x in (a.vararg, a.kwarg) if x]]


def shadowing(tree, module):
    """[(line, what, where, name)] of every builtin shadowed in one module;
    `where` is the qualified name of the function ("" at module level)."""
    found = []

    def scope(body_nodes, where, in_function):
        # Walks one scope: its own bindings, and the scopes nested in it.
        stack = list(body_nodes)
        while stack:
            node = stack.pop()
            for name in _targets(node):
                if name in BUILTINS:
                    what = "local" if in_function else "module-level name"
                    if where and not in_function:
                        what = "class attribute"
                    found.append((node.lineno, what, where, name))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                name = getattr(node, "name", "<lambda>")
                qual = f"{where}.{name}" if where else name
                for p in _params(node):
                    if p in BUILTINS:
                        found.append((node.lineno, "parameter", qual, p))
                stack += node.args.defaults + [d for d in node.args.kw_defaults if d is not None]
                stack += node.decorator_list if not isinstance(node, ast.Lambda) else []
                body = node.body if isinstance(node.body, list) else [node.body]
                scope(body, qual, True)
            elif isinstance(node, ast.ClassDef):
                qual = f"{where}.{node.name}" if where else node.name
                stack += node.bases + node.decorator_list
                scope(node.body, qual, in_function)
            else:
                stack += list(ast.iter_child_nodes(node))

    scope(tree.body, "", False)
    return sorted(found)


class BuiltinNamesTest(unittest.TestCase):
    def test_no_name_in_graphd_shadows_a_builtin(self):
        bad, used = [], set()
        for module, (path, _) in sorted(modules(package_dir()).items()):
            for line, what, where, name in shadowing(parse(path), module):
                if what == "class attribute":
                    continue  # an attribute (Client.clear), reached through its object
                key = (module, where, name)
                if key in ALLOWED:
                    used.add(key)
                    continue
                bad.append(f"{module}:{line}: {what} {name!r}" + (f" in {where}" if where else ""))
        if bad:
            self.fail("names that shadow Python builtins (rename them; a keyword that callers rely on goes into "
                      "ALLOWED with the reason):\n" + "\n".join(bad))
        self.assertEqual(sorted(set(ALLOWED) - used), [], "ALLOWED names a parameter that is gone")

    def test_the_reader_finds_each_kind_of_binding(self):
        src = (
            "import os as id\n"
            "type = 1\n"
            "def f(input, *, len=0, **format):\n"
            "    for bytes in ():\n"
            "        pass\n"
            "    g = lambda hash: hash\n"
            "    try:\n"
            "        pass\n"
            "    except Exception as iter:\n"
            "        pass\n"
            "    def next():\n"
            "        from os import sep as min\n"
            "class C:\n"
            "    def m(self, all):\n"
            "        max = 1\n"
            "    vars = 2\n"
            "ok = [sum for sum in ()]\n"
        )
        got = [(line, what, where, name) for line, what, where, name in shadowing(ast.parse(src), "m")]
        self.assertEqual(got, [
            (1, "module-level name", "", "id"),
            (2, "module-level name", "", "type"),
            (3, "parameter", "f", "format"),
            (3, "parameter", "f", "input"),
            (3, "parameter", "f", "len"),
            (4, "local", "f", "bytes"),
            (6, "parameter", "f.<lambda>", "hash"),
            (9, "local", "f", "iter"),
            (11, "local", "f", "next"),
            (12, "local", "f.next", "min"),
            (14, "parameter", "C.m", "all"),
            (15, "local", "C.m", "max"),
            (16, "class attribute", "C", "vars"),
            (17, "module-level name", "", "sum"),
        ])


class PublicHomesTest(unittest.TestCase):
    def test_public_classes_and_functions_live_in_public_modules(self):
        # What graphd and graphd.client export is defined in a module whose
        # name has no private part (Client lived in graphd._lib).
        import graphd
        import graphd.client
        bad = []
        for mod in (graphd, graphd.client):
            for name in mod.__all__:
                obj = getattr(mod, name)
                if inspect.isclass(obj) or inspect.isfunction(obj):
                    home = obj.__module__
                    if any(part.startswith("_") for part in home.split(".")):
                        bad.append(f"{mod.__name__}.{name} is defined in {home}")
        self.assertEqual(bad, [])
        self.assertIs(graphd.Client, graphd.client.Client)


if __name__ == "__main__":
    unittest.main()
