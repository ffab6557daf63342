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
