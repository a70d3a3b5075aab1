"""The house's import rules, read from the source with ast (nothing is imported):
no import circle among the scheduler's modules, lazy imports inside functions
included (a circle hidden in a function still ties two modules together), and the
process packages meet only in shm/: frontend and workers import nothing of the
scheduler or of each other, and shm imports none of them."""

import ast
import functools
import gc
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("scheduler", "frontend", "workers", "shm")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}


# Imports are statements: every one sits in a statement list of these fields (a
# function's, class's, branch's, loop's, with's, try's and its handlers', a match's
# cases'), so walking those lists finds them all without visiting the expressions, most
# of a module's nodes.
_BLOCKS = ("body", "orelse", "finalbody", "handlers", "cases")


def statements(tree: ast.Module):
    """Every statement of `tree`, at any depth (with except handlers and match cases,
    which hold statements)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        for field in _BLOCKS:
            block = getattr(node, field, None)
            if isinstance(block, list):
                todo.extend(block)


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """Every project module `name` imports, at any depth of its code. `from a import b`
    counts as importing a.b where a.b is a module, else a."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in statements(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                       for a in node.names]
        else:
            continue
        found.update(t for t in targets if t in known and t != name)
    return found


@functools.cache  # parsed once for both tests: parsing is most of their time
def graph() -> dict[str, set[str]]:
    known = all_modules()
    # The trees hold no cycles and are freed as each module is read: the collector's
    # passes, set off by their ~200k nodes, would only walk the suite's live objects.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return {name: imports_of(name, path, known) for name, path in known.items()}
    finally:
        if was_enabled:
            gc.enable()


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import circle among `edges`' nodes, as the path that closes it, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node):
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def test_find_cycle_sees_a_circle():
    """The checker itself: a circle through three modules is found, a chain is not."""
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_scheduler_modules_import_no_circle():
    edges = graph()
    sched = {m: {d for d in deps if d.split(".")[0] == "scheduler"}
             for m, deps in edges.items() if m.split(".")[0] == "scheduler"}
    assert len(sched) > 30, "the walk found too few scheduler modules"
    assert find_cycle(sched) is None, " -> ".join(find_cycle(sched))


def test_process_packages_meet_only_in_shm():
    allowed = {"scheduler": {"scheduler", "shm"}, "frontend": {"frontend", "shm"},
               "workers": {"workers", "shm"}, "shm": {"shm"}}
    wrong = sorted(f"{m} imports {d}" for m, deps in graph().items() for d in deps
                   if d.split(".")[0] not in allowed[m.split(".")[0]])
    assert not wrong, wrong
