"""docs/architecture.md's layering: the library never imports an application, and no application imports another;
what two share lives in the library (generation.py, decoding.py, pipelines/stages.py, ...)."""
import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "sesame"
# the command line and the Python API sit above the applications and call them
ABOVE = (("sesame", "api"), ("sesame", "cli"), ("sesame", "commands"))


def module_name(path: Path) -> tuple[str, ...]:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return parts[:-1] if parts[-1] == "__init__" else parts


def imported(path: Path, source: str) -> set[tuple[str, ...]]:
    """What ``source``, the text of ``path``, imports, as absolute names: ``from M import x`` gives M.x (x may be a
    module of package M)."""
    package = module_name(path) if path.name == "__init__.py" else module_name(path)[:-1]
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {tuple(alias.name.split(".")) for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else ()
            target = base + tuple(node.module.split(".")) if node.module else base
            found |= {target + (alias.name,) for alias in node.names}
    return found


def app_of(name: tuple[str, ...]) -> str | None:
    return name[2] if name[:2] == ("sesame", "apps") and len(name) > 2 else None


def crossings(path: Path, source: str) -> list[str]:
    """The imports of an application's internals by the library or by another application."""
    here = module_name(path)
    if here == ("sesame",) or any(here[: len(top)] == top for top in ABOVE):
        return []
    return [f"{'.'.join(here)} imports {'.'.join(name)}" for name in sorted(imported(path, source))
            if app_of(name) is not None and app_of(name) != app_of(here)]


def test_applications_build_on_the_library_alone():
    assert [line for path in sorted(PACKAGE.rglob("*.py")) for line in crossings(path, path.read_text())] == []


def test_the_check_reads_relative_imports_of_other_applications_and_of_the_library():
    app, library = PACKAGE / "apps" / "serve" / "app.py", PACKAGE / "generation.py"
    assert crossings(app, "from ..generate import tldr\n") == [
        "sesame.apps.serve.app imports sesame.apps.generate.tldr"]
    assert crossings(app, "from . import worker\nfrom ...generation import generate\n") == []
    assert crossings(library, "from .apps import generate\n") == ["sesame.generation imports sesame.apps.generate"]


# family behaviour the registry's rows hold as objects (sesame.families.Reader, InputFormat, SourceStart,
# continued_words), which were flags the pipelines tested: no module outside the registry reads such a flag
RETIRED_FLAGS = {"feature_extractor", "word_vectors", "target_words", "input_tokens", "document_inputs", "source_bos"}
REGISTRY = PACKAGE / "families.py"
# where a family's registry row is looked up by name: where a model is resolved (a --from/--model source, a pretrain
# spec's family, a transformers checkpoint converted or exported, a run generated from) and the applications' own;
# the pipelines get the row passed along
LOOKUPS = {"sources.py": 1, "specs.py": 1, "interop/hf_import.py": 2, "apps/cove.py": 1, "apps/compare/approaches.py": 1}


def flags_read(source: str) -> list[str]:
    return sorted(node.attr for node in ast.walk(ast.parse(source))
                  if isinstance(node, ast.Attribute) and node.attr in RETIRED_FLAGS)


def registry_lookups(source: str) -> int:
    """Look-ups of one family's row: ``FAMILIES[name]``, ``FAMILIES.get(name)``, ``get_family(name)``,
    ``hf_family(...)`` (the registry listed whole, for choices or a message, is no look-up)."""
    def is_registry(node: ast.AST) -> bool:
        return isinstance(node, ast.Name) and node.id == "FAMILIES"
    count = 0
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Subscript) and is_registry(node.value):
            count += 1
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("get_family",
                                                                                                 "hf_family"):
            count += 1
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" \
                and is_registry(node.func.value):
            count += 1
    return count


def test_no_module_outside_the_registry_reads_a_family_behaviour_flag():
    assert {str(p.relative_to(PACKAGE)): flags_read(p.read_text()) for p in sorted(PACKAGE.rglob("*.py"))
            if p != REGISTRY and flags_read(p.read_text())} == {}
    assert flags_read("if fam.feature_extractor and not spec.fam.target_words:\n    pass\n") == [
        "feature_extractor", "target_words"]


def test_the_registry_is_looked_up_where_a_model_is_resolved_and_passed_along_from_there():
    found = {str(p.relative_to(PACKAGE)): registry_lookups(p.read_text()) for p in sorted(PACKAGE.rglob("*.py"))
             if p != REGISTRY}
    assert {path: n for path, n in found.items() if n} == LOOKUPS
    assert registry_lookups("a = FAMILIES[x].pooling\nb = FAMILIES.get(y)\nc = get_family(z)\n"
                            "d = [f.name for f in FAMILIES.values()]\n") == 3


def import_graph() -> dict[tuple[str, ...], set[tuple[str, ...]]]:
    """Each sesame module and the sesame modules it imports, counting every import wherever it stands (module level,
    inside a function, under ``TYPE_CHECKING``): ``from M import x`` is an edge to M.x when that is a module, else to
    M; a package's ``__init__`` is the package itself."""
    modules = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        edges = set()
        for target in imported(path, path.read_text()):
            while target and target not in modules:
                target = target[:-1]
            if target and target != name:
                edges.add(target)
        graph[name] = edges
    return graph


def cycles(graph: dict[tuple[str, ...], set[tuple[str, ...]]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(".".join(member))
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle_among_sesame_modules():
    assert cycles(import_graph()) == []


def test_the_cycle_check_sees_imports_inside_functions_and_under_type_checking():
    a, b, c = ("sesame", "a"), ("sesame", "b"), ("sesame", "c")
    assert cycles({a: {b}, b: {c}, c: {a}}) == [["sesame.a", "sesame.b", "sesame.c"]]
    assert cycles({a: {b}, b: set()}) == []
    source = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .run import RunConfig\n" \
             "def f():\n    from .apps import demo\n"
    assert imported(PACKAGE / "generation.py", source) >= {("sesame", "run", "RunConfig"), ("sesame", "apps", "demo")}


def test_no_library_module_imports_an_application():
    graph = import_graph()
    library = [name for name in graph if name[:2] != ("sesame", "apps") and name != ("sesame",)
               and not any(name[: len(top)] == top for top in ABOVE)]
    assert [".".join(name) for name in sorted(library) for target in graph[name] if target[:2] == ("sesame", "apps")] \
        == []
