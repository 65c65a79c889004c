"""docs/design.md names only code that exists, and its module map names every module of the package.

The rules, applied to docs/design.md as text (the names are resolved on grpolab's source with
``ast``: no model, no torch, about a second for the whole module):

1. A *code reference* is
   - an inline code span (single backticks, outside fenced blocks, possibly wrapped over a line break) that is a
     dotted Python name, optionally followed by a call's parentheses: ``module.name``, ``Class.method``,
     ``pkg.module.Class.attr``, ``grpolab.x.y``, ``Class.method(...)``; a span whose last part is a file extension
     (``manifest.json``, ``.grpolab.lock``, ``runs.py``) is a file name, not a Python name;
   - a dotted call in a fenced block (``Name.attr(`` ... as in the data flow of section 2);
   - an inline span that is a path (letters, digits, ``_ . -`` separated by ``/``) whose first component is a package
     or module of grpolab (``algo/loss.py``, ``rewards/``, ``grpolab/cli/app.py``) or a top-level folder of the
     repository (``docs/evaluation.md``, ``tests/...``).
2. A dotted name resolves when one of these holds (tried in this order; ``grpolab.`` in front is dropped):
   - its leading parts name a module or package of grpolab and the rest are attributes defined in it (top-level
     ``def`` / ``class`` / assignment / import, a name in ``__all__`` or a lazy ``_LAZY`` table), then attributes of
     the class found (methods, class-level fields, also of its base classes);
   - it is a config path: its first part is a field of ``grpolab.config.Config`` and each next part a field of the
     config class the previous one is annotated with (the rest of the path is free below a ``dict`` field);
   - its first part is a class defined anywhere in grpolab and the rest are attributes of one such class;
   - its first part is a module importable outside grpolab (``os.unshare``, ``importlib.util``): not ours, skipped.
   Anything else (``Task.sample``, ``Trainer.update``) fails.
3. A path resolves when the file or folder exists (``grpolab/`` is implied for grpolab's packages).
4. Section 3 (the module map) names every module of grpolab, in an inline code span: ``grpolab/x/y.py`` as
   ``x/y.py``, ``grpolab/x/y.py``, ``x.y`` or ``grpolab.x.y``; a package's ``__init__.py`` by its package (``x/``,
   ``grpolab/x/``, ``grpolab.x``); ``grpolab/__init__.py`` as ``grpolab/``. Every path that section names (a span
   ending in ``.py`` or ``/``) exists. Modules are found by walking grpolab/, so a module added, moved or removed
   without the map following fails here.
5. Every path inside a run directory the page mentions (``runs/<name>/checkpoints/final``) is one section 6's tree
   lists (``step-N`` matches ``step-12``), and every file name in that tree is written by the code (it occurs as a
   string literal, or a constant's value, in grpolab's source).
6. The page says each package's ``__init__`` says what lives there: every module of a package is named in its
   ``__init__`` docstring, as ``mod``, `mod`, mod.py, pkg.mod or mod.<attribute>, or as a plain word of a paragraph
   that starts with "Modules" (a plain word elsewhere in the prose does not count).
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "grpolab"
DESIGN = ROOT / "docs" / "design.md"
FILE_EXTENSIONS = {
    "py",
    "json",
    "jsonl",
    "yaml",
    "yml",
    "toml",
    "md",
    "html",
    "txt",
    "pt",
    "safetensors",
    "lock",
    "gguf",
    "csv",
    "png",
    "svg",
    "cfg",
    "ini",
}
# the repository's own top-level folders (not a local shared/ data folder or a virtual environment, which differ by machine)
REPO_FOLDERS = ("benchmarks", "configs", "docs", "examples", "grpolab", "tests")

FENCE = re.compile(r"^```.*?^```", re.S | re.M)
INLINE = re.compile(r"`([^`]+)`")
DOTTED = re.compile(r"^([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(\(.*\))?$", re.S)
FENCED_CALL = re.compile(r"(?<![\w.])([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)\(")
PATH = re.compile(r"^[\w.-]+(?:/[\w.-]+)*/?$")


# ------------------------------------------------------------------------------------------------ reading the page


def fenced_blocks(text: str) -> list[str]:
    return FENCE.findall(text)


def inline_spans(text: str) -> list[str]:
    """Inline code spans outside fenced blocks, whitespace (a wrapped line) collapsed."""
    return [" ".join(s.split()) for s in INLINE.findall(FENCE.sub("", text))]


def section(text: str, number: int) -> str:
    """The text of '## N. ...' up to the next '## ' heading."""
    match = re.search(rf"^## {number}\.[^\n]*\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert match, f"docs/design.md: no section '## {number}.'"
    return match.group(1)


def is_file_name(token: str) -> bool:
    return token.rsplit(".", 1)[-1].lower() in FILE_EXTENSIONS


def dotted_references(text: str) -> list[str]:
    """Rule 1: the dotted names of inline spans and the dotted calls of fenced blocks, in page order."""
    names = []
    for span in inline_spans(text):
        m = DOTTED.match(span)
        if m and not is_file_name(m.group(1)):
            names.append(m.group(1))
    for block in fenced_blocks(text):
        names += FENCED_CALL.findall(block)
    return names


def path_references(text: str) -> list[str]:
    """Rule 1: inline spans that are paths under grpolab/ (or its packages) or under a top-level repo folder."""
    out = []
    for span in inline_spans(text):
        if "/" not in span and not span.endswith(".py") or not PATH.match(span):
            continue
        first = span.split("/")[0]
        ours = (PKG / first).is_dir() or (PKG / first).with_suffix(".py").is_file()
        if first == "grpolab" or first in REPO_FOLDERS or ours:
            out.append(span)
    return out


# ------------------------------------------------------------------------------------------------ the code, by ast


@functools.lru_cache(maxsize=None)
def module_tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), str(path))


def module_file(parts: tuple[str, ...]) -> Path | None:
    """grpolab/<parts>.py or grpolab/<parts>/__init__.py."""
    base = PKG.joinpath(*parts) if parts else PKG
    if parts and base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    return None


def _targets(node: ast.stmt) -> list[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, ast.Assign):
        return [t.id for t in node.targets if isinstance(t, ast.Name)]
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return [node.target.id]
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return [(a.asname or a.name).split(".")[0] for a in node.names]
    return []


def _literal_names(tree: ast.Module, variable: str) -> set[str]:
    """The strings of a top-level `variable = [...]` / `{...: ...}` (``__all__``, ``_LAZY``)."""
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and variable in _targets(node) and node.value is not None:
            value = node.value
            items = value.keys if isinstance(value, ast.Dict) else getattr(value, "elts", [])
            return {i.value for i in items if isinstance(i, ast.Constant) and isinstance(i.value, str)}
    return set()


def top_level(tree: ast.Module) -> dict[str, ast.stmt]:
    """Top-level names of a module (incl. those under `if`/`try` blocks) -> the statement defining them."""
    out: dict[str, ast.stmt] = {}
    stack = list(tree.body)
    while stack:
        node = stack.pop()
        for name in _targets(node):
            out.setdefault(name, node)
        if isinstance(node, (ast.If, ast.Try)):
            handlers = [s for h in getattr(node, "handlers", []) for s in h.body]
            stack += node.body + node.orelse + getattr(node, "finalbody", []) + handlers
    return out


@functools.lru_cache(maxsize=None)
def classes() -> dict[str, list[ast.ClassDef]]:
    """Every top-level class of grpolab by name."""
    out: dict[str, list[ast.ClassDef]] = {}
    for path in sorted(PKG.rglob("*.py")):
        for node in module_tree(path).body:
            if isinstance(node, ast.ClassDef):
                out.setdefault(node.name, []).append(node)
    return out


def class_has(cls: ast.ClassDef, attr: str, seen: frozenset[str] = frozenset()) -> bool:
    """`attr` is defined in the class body (method, field, property) or in a grpolab base class."""
    if any(attr in _targets(node) for node in cls.body):
        return True
    for base in cls.bases:
        name = base.id if isinstance(base, ast.Name) else getattr(base, "attr", None)
        if name and name not in seen:
            if any(class_has(b, attr, seen | {name}) for b in classes().get(name, [])):
                return True
    return False


def resolve_in_class(cls: ast.ClassDef, rest: list[str]) -> bool:
    return len(rest) == 1 and class_has(cls, rest[0]) if rest else True


def imported_from(node: ast.stmt, path: Path) -> list[str] | None:
    """The grpolab module (parts below grpolab/) that ``from X import name`` in the module at `path` reads from;
    None for any other statement or a module outside grpolab."""
    if not isinstance(node, ast.ImportFrom):
        return None
    module = (node.module or "").split(".") if node.module else []
    if node.level:
        package = list(path.parent.relative_to(PKG).parts)
        return package[: len(package) - node.level + 1] + module
    return module[1:] if module[:1] == ["grpolab"] else None


def resolve_module_path(parts: list[str], from_root: bool = False) -> bool:
    """Rule 2, first way: module/package prefix, then module attributes, then class attributes. `from_root`: the
    name was written ``grpolab.x``, so x may also be a name of the grpolab package itself."""
    for cut in range(len(parts), -1 if from_root else 0, -1):
        path = module_file(tuple(parts[:cut]))
        if path is None:
            continue
        rest = parts[cut:]
        if not rest:
            return True
        tree = module_tree(path)
        names = top_level(tree)
        if rest[0] in names:
            node = names[rest[0]]
            if len(rest) == 1:
                return True
            source = imported_from(node, path)
            if source is not None:  # a re-export (``rewards.RewardSet``): resolve it where it is defined
                original = next(a.name for a in node.names if (a.asname or a.name) == rest[0])
                return resolve_module_path([*source, original, *rest[1:]], from_root=True)
            return isinstance(node, ast.ClassDef) and resolve_in_class(node, rest[1:])
        lazy = _literal_names(tree, "__all__") | _literal_names(tree, "_LAZY")
        return len(rest) == 1 and rest[0] in lazy
    return False


def resolve_config_path(parts: list[str]) -> bool:
    """Rule 2, second way: Config.<field>.<field>... through the annotated config classes of grpolab/config/schema.py."""
    config_classes = {n.name: n for n in module_tree(PKG / "config" / "schema.py").body if isinstance(n, ast.ClassDef)}
    cls = config_classes.get("Config")
    for i, part in enumerate(parts):
        if cls is None:
            return False
        fields = {
            n.target.id: ast.unparse(n.annotation)
            for n in cls.body
            if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
        }
        if part not in fields:
            return False
        annotation = fields[part]
        if annotation.startswith(("dict", "Mapping")) and i + 1 < len(parts):
            return True
        cls = config_classes.get(annotation)
    return True


def resolve_class_path(parts: list[str]) -> bool:
    """Rule 2, third way: a grpolab class named by itself, then its attributes."""
    return any(resolve_in_class(cls, parts[1:]) for cls in classes().get(parts[0], []))


def is_external(first: str) -> bool:
    try:
        return importlib.util.find_spec(first) is not None
    except (ImportError, ValueError):
        return False


def resolves(name: str) -> bool:
    parts = name.split(".")
    if parts[0] == "grpolab":
        return resolve_module_path(parts[1:], from_root=True) if len(parts) > 1 else True
    if resolve_module_path(parts) or resolve_config_path(parts) or resolve_class_path(parts):
        return True
    top = module_file((parts[0],)) is not None or parts[0] in classes() or parts[0] in _config_fields()
    return not top and is_external(parts[0])


@functools.lru_cache(maxsize=None)
def _config_fields() -> frozenset[str]:
    body = module_tree(PKG / "config" / "schema.py").body
    config = next(n for n in body if isinstance(n, ast.ClassDef) and n.name == "Config")
    fields = [n.target for n in config.body if isinstance(n, ast.AnnAssign)]
    return frozenset(t.id for t in fields if isinstance(t, ast.Name))


def path_exists(path: str) -> bool:
    first = path.split("/")[0]
    base = ROOT if first == "grpolab" or first in REPO_FOLDERS else PKG
    return (base / path.rstrip("/")).exists()


# ------------------------------------------------------------------------------------------------ layout and run dir


def packages() -> list[str]:
    return sorted(p.parent.name for p in PKG.glob("*/__init__.py"))


def modules() -> list[Path]:
    """Every module of grpolab, found by walking the package (build outputs and caches left out)."""
    return sorted(p for p in PKG.rglob("*.py") if "__pycache__" not in p.parts)


def spellings(module: Path) -> set[str]:
    """Rule 4: the names that name `module` on the map (paths relative to grpolab/ or to the repository, dotted)."""
    parts = module.relative_to(PKG).with_suffix("").parts
    if parts[-1] == "__init__":
        package = parts[:-1]
        if not package:
            return {"grpolab/", "grpolab/__init__.py"}
        path = "/".join(package)
        return {f"{path}/", f"grpolab/{path}/", f"{path}/__init__.py", f"grpolab/{path}/__init__.py"} | {
            "grpolab." + ".".join(package)
        }
    path = "/".join(parts) + ".py"
    dotted = ".".join(parts)
    return {path, f"grpolab/{path}", f"grpolab.{dotted}"} | ({dotted} if len(parts) > 1 else set())


def map_spans(text: str) -> set[str]:
    """The inline code spans of a module map, a call's parentheses dropped."""
    return {re.sub(r"\(.*\)$", "", span, flags=re.S) for span in inline_spans(text)}


def module_map_problems(text: str, found: list[Path]) -> list[str]:
    """Rule 4 on one module map: the modules of `found` it does not name, and the paths it names that do not
    exist (spans ending in .py or /)."""
    spans = map_spans(text)
    problems = [f"{m.relative_to(ROOT)} is not on the map" for m in found if not spellings(m) & spans]
    named_paths = sorted(s for s in spans if PATH.match(s) and (s.endswith(".py") or s.endswith("/")))
    problems += [f"`{s}` is on the map but does not exist" for s in named_paths if not path_exists(s)]
    return problems


def run_dir_entries(text: str) -> list[str]:
    """Section 6's tree as relative paths ('checkpoints/step-N/checksums.json'), from its indentation."""
    block = next(b for b in fenced_blocks(section(text, 6)) if "runs/" in b)
    entries: list[str] = []
    stack: list[tuple[int, str]] = []
    for line in block.splitlines()[1:-1]:
        m = re.match(r"^( *)(\S+)", line)
        if not m or m.group(2).startswith("runs/") or not re.match(r"^[\w.*<>-]+/?", m.group(2)):
            continue
        indent, name = len(m.group(1)), m.group(2)
        if not re.match(r"^[\w.*<>-]+(/[\w.*<>-]+)*/?$", name):
            continue
        while stack and stack[-1][0] >= indent:
            stack.pop()
        parent = stack[-1][1] if stack else ""
        if stack and not parent.endswith("/"):
            continue  # a description's continuation line
        full = parent + name
        entries.append(full)
        stack.append((indent, full))
    return entries


def entry_pattern(entry: str) -> re.Pattern:
    """'checkpoints/step-N/' -> matches 'checkpoints/step-12' and its prefix 'checkpoints'."""
    out = re.escape(entry.rstrip("/"))
    out = out.replace(r"\*", r"[^/]*").replace("N", r"(?:N|\d+)")
    out = re.sub(r"<[^>]*>", r"<[^>/]*>", out.replace(r"\<", "<").replace(r"\>", ">"))
    return re.compile(out + "$")


def run_dir_mentions(text: str) -> list[str]:
    return re.findall(r"runs/<[^>/]+>/([\w./<>*-]+)", text)


def string_constants() -> set[str]:
    out: set[str] = set()
    for path in PKG.rglob("*.py"):
        for node in ast.walk(module_tree(path)):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                out.add(node.value)
    return out


# ------------------------------------------------------------------------------------------------ tests


@pytest.fixture(scope="module")
def design() -> str:
    return DESIGN.read_text(encoding="utf-8")


def test_the_rules_catch_what_they_are_for():
    """The resolver on names that exist and names that do not (the three the issue found in the old page)."""
    for good in (
        "algo.loss.objective",
        "rewards.REWARD_FUNCTIONS",
        "rewards.RewardSet.score_many",
        "RewardSet.score_many",
        "tasks.register_task",
        "grpolab.train",
        "RolloutEngine.generate",
        "train.steps",
        "reward.weights.mine",
        "training.trainer.Trainer.fit",
        "AgentCollector.advantages",
        "os.unshare",
        "grpolab.evaluation",
    ):
        assert resolves(good), good
    for bad in (
        "Task.sample",
        "Trainer.update",
        "algo.advantages.advantages",
        "rewards.NO_SUCH",
        "train.no_such_field",
        "NoSuchClass.method",
        "rollout.no_such",
        "grpolab.no_such_module",
    ):
        assert not resolves(bad), bad
    assert path_exists("algo/logprobs.py") and path_exists("grpolab/cli/app.py") and path_exists("docs/design.md")
    assert not path_exists("algo/no_such.py")
    assert all((ROOT / folder).is_dir() for folder in REPO_FOLDERS), REPO_FOLDERS
    old = (
        "```\nrun/\n```\n`Task.sample(x)` `manifest.json` `a.b c` `algo/x.py` `shared/data`\n"
        "```\nTrainer.update(...)\n```"
    )
    assert dotted_references(old) == ["Task.sample", "Trainer.update"]
    assert path_references(old) == ["algo/x.py"]
    algo = [PKG / "algo" / "__init__.py", PKG / "algo" / "loss.py", PKG / "algo" / "kl.py", PKG / "runs.py"]
    assert spellings(algo[1]) == {"algo/loss.py", "grpolab/algo/loss.py", "algo.loss", "grpolab.algo.loss"}
    assert spellings(algo[3]) == {"runs.py", "grpolab/runs.py", "grpolab.runs"}
    page = "- `algo/` the math: `algo/loss.py` (`algo.loss.objective`), `grpolab.algo.kl`; `runs.py`; `algo/gone.py`"
    assert module_map_problems(page, algo) == ["`algo/gone.py` is on the map but does not exist"]
    assert module_map_problems(page.replace("`grpolab.algo.kl`", "kl"), algo) == [
        "grpolab/algo/kl.py is not on the map",
        "`algo/gone.py` is on the map but does not exist",
    ]
    assert PKG / "rollout" / "decode.py" in modules() and PKG / "__init__.py" in modules()
    assert entry_pattern("checkpoints/step-N/").match("checkpoints/step-12")
    assert not entry_pattern("checkpoints/step-N/").match("checkpoints/final")


def test_every_python_name_the_design_names_exists(design):
    missing = [name for name in dotted_references(design) if not resolves(name)]
    assert not missing, f"docs/design.md names Python names that do not exist in grpolab: {missing}"


def test_every_path_the_design_names_exists(design):
    missing = [p for p in path_references(design) if not path_exists(p)]
    assert not missing, f"docs/design.md names paths that do not exist: {missing}"


def test_the_module_map_names_every_module_and_only_modules_that_exist(design):
    problems = module_map_problems(section(design, 3), modules())
    assert not problems, "docs/design.md section 3 (the module map): " + "; ".join(problems)


def unnamed_modules(package: Path) -> list[str]:
    """Rule 6: the modules of `package` its __init__ docstring does not name."""
    doc = ast.get_docstring(module_tree(package / "__init__.py")) or ""
    listed = " ".join(re.findall(r"(?:^|\n)(Modules\b.*?)(?:\n\s*\n|\Z)", doc, re.S))
    missing = []
    for module in sorted(package.glob("*.py")):
        stem = module.stem
        named = rf"``{stem}``|`{stem}`|(?<![\w.]){stem}\.py\b|\b{package.name}\.{stem}\b|(?<![\w.]){stem}\.[A-Za-z_]"
        if stem != "__init__" and not re.search(named, doc) and not re.search(rf"(?<![\w.]){stem}(?![\w])", listed):
            missing.append(module.name)
    return missing


def test_every_package_docstring_names_its_modules():
    missing = {p: unnamed_modules(PKG / p) for p in packages()}
    missing = {f"grpolab/{p}/__init__.py": m for p, m in missing.items() if m}
    assert not missing, f"package docstrings that do not name their modules (docs/design.md section 3): {missing}"


def test_run_directory_paths_are_the_ones_section_6_lists(design):
    entries = run_dir_entries(design)
    assert "manifest.json" in entries and any(e.startswith("checkpoints/") for e in entries), entries
    patterns = [entry_pattern(e) for e in entries]
    unknown = [m for m in run_dir_mentions(design) if not any(p.match(m.rstrip("/")) for p in patterns)]
    assert not unknown, f"docs/design.md mentions run-directory paths section 6 does not list: {unknown}"
    literals = string_constants()
    names = {e.rstrip("/").split("/")[-1] for e in entries}
    literal_names = [n for n in names if "<" not in n and "*" not in n and not n.endswith("-N")]
    unwritten = sorted(n for n in literal_names if n not in literals)
    assert not unwritten, f"docs/design.md section 6 lists files no grpolab code names: {unwritten}"
