"""Layering: the runtime (and the schedule store, and the compile driver) never import the tuner.
Walks the AST of every module, so an import inside a function counts too."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import tilefuse

PACKAGE = Path(tilefuse.__file__).parent


def _imports(path: Path, source: str | None = None) -> list[tuple[int, str]]:
    """(line, module) of every import in ``path`` (or in ``source``, as if it were there),
    relative ones resolved."""
    package = ["tilefuse", *path.relative_to(PACKAGE).parent.parts]
    found = []
    text = path.read_text() if source is None else source
    for node in ast.walk(ast.parse(text, str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *(node.module or "").split(".")]).strip(".")
            found.append((node.lineno, module))
            # ``from tilefuse import tune`` names the package in the alias
            found += [(node.lineno, f"{module}.{a.name}") for a in node.names]
    return found


@pytest.mark.parametrize("where", ["runtime", "schedules", "driver.py", "target.py"])
def test_builds_never_import_the_tuner(where: str) -> None:
    paths = [PACKAGE / where] if where.endswith(".py") else sorted((PACKAGE / where).rglob("*.py"))
    assert paths and all(p.is_file() for p in paths)
    bad = [f"{p.relative_to(PACKAGE)}:{line} imports {module}" for p in paths
           for line, module in _imports(p)
           if module == "tilefuse.tune" or module.startswith("tilefuse.tune.")]
    assert not bad, "\n".join(bad)


def test_the_walk_sees_imports() -> None:
    """The check above can fail: it finds function-level, relative and aliased imports."""
    source = ("def f():\n    from tilefuse.tune.database import TuneKey\n"
              "from tilefuse import tune\nfrom ..tune import api\nimport tilefuse.tune.gpu\n")
    found = {m for _, m in _imports(PACKAGE / "runtime" / "probe.py", source)}
    assert {"tilefuse.tune.database", "tilefuse.tune", "tilefuse.tune.api",
            "tilefuse.tune.gpu"} <= found


def test_old_names_still_import() -> None:
    from tilefuse.schedules.database import SQLiteDatabase
    from tilefuse.tune.database import SQLiteDatabase as Old
    from tilefuse.tune.fingerprint import group_fingerprint

    assert Old is SQLiteDatabase and callable(group_fingerprint)


def _module_level(path: Path, source: str | None = None) -> list[tuple[int, str]]:
    """(line, module) of the imports a module runs when it is imported: its top-level
    statements, not function bodies nor ``if TYPE_CHECKING:`` blocks."""
    tree = ast.parse(path.read_text() if source is None else source, str(path))
    top = [n for n in tree.body if not (isinstance(n, ast.If) and "TYPE_CHECKING" in
                                        ast.unparse(n.test))]
    source = "\n".join(ast.unparse(n) for n in top if isinstance(n, (ast.Import, ast.ImportFrom)))
    return _imports(path, source)


def test_runtime_never_imports_the_back_ends() -> None:
    """``runtime/`` executes what the back ends (``tilefuse.backend``) build; importing it
    imports no back end (a builder that compiles on first use imports one in its body)."""
    bad = [f"{p.relative_to(PACKAGE)} imports {module}"
           for p in sorted((PACKAGE / "runtime").rglob("*.py"))
           for _, module in _module_level(p)
           if module == "tilefuse.backend" or module.startswith("tilefuse.backend.")]
    assert not bad, "\n".join(bad)


def test_the_module_level_walk_sees_imports() -> None:
    probe = PACKAGE / "runtime" / "probe.py"
    source = ("from typing import TYPE_CHECKING\nimport tilefuse.backend.cpu\n"
              "if TYPE_CHECKING:\n    from tilefuse.backend import cuda\n"
              "def f():\n    from tilefuse.backend import cuda\n")
    assert "tilefuse.backend.cuda" in {m for _, m in _imports(probe, source)}
    assert {m for _, m in _module_level(probe, source)} == {"typing", "typing.TYPE_CHECKING",
                                                             "tilefuse.backend.cpu"}


def test_no_module_over_800_lines() -> None:
    """Files of one job: none over ~800 lines (the matmul lowerings' owners split theirs)."""
    exempt = {"kernel/lower_matmul.py", "kernel/lower_qmatmul.py"}
    long = [f"{p.relative_to(PACKAGE)}: {n} lines" for p in sorted(PACKAGE.rglob("*.py"))
            if str(p.relative_to(PACKAGE)) not in exempt
            and (n := len(p.read_text().splitlines())) > 800]
    assert not long, "\n".join(long)
