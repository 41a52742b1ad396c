"""The name users install: every `pip install` of ours in the README, the
docs and the package's own hints names the distribution `pyproject.toml`
builds (`snapdiff` on the public index is another author's tool), with
extras it declares; and that distribution, installed, brings the
`snapdiff` package and command."""

import importlib.metadata
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# `pip install NAME`, `pip install 'NAME[extra]'`, `pip install -U NAME`.
INSTALL = re.compile(r"pip install (?:-\S+ )*(['\"]?)([A-Za-z0-9_.\-]+)(?:\[([^\]]*)\])?\1")


def project():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def normalized(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def test_every_install_line_names_the_distribution_we_build():
    ours = normalized(project()["name"])
    extras = set(project().get("optional-dependencies", {}))
    texts = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    texts += sorted((ROOT / "python").rglob("*.py"))
    seen = []
    for path in texts:
        for match in INSTALL.finditer(path.read_text()):
            name, wanted = match.group(2), match.group(3)
            if "snapdiff" not in name.lower():
                continue  # torch, duckdb, ...
            where = f"{path.relative_to(ROOT)}: {match.group(0)}"
            assert normalized(name) == ours, where
            for extra in filter(None, (wanted or "").split(",")):
                assert extra.strip() in extras, where
            seen.append(where)
    assert any(w.startswith("README.md") for w in seen), seen
    assert ours != "snapdiff", "snapdiff on the public index is another author's package"


def test_the_installed_distribution_brings_the_package_and_the_command():
    name = project()["name"]
    files = {str(f) for f in importlib.metadata.distribution(name).files}
    assert "snapdiff/__init__.py" in files, sorted(files)[:20]
    assert any(re.search(r"(^|/)snapdiff(\.exe)?$", f) for f in files), sorted(files)
    assert importlib.metadata.packages_distributions()["snapdiff"] == [name]


def test_the_installed_commands_demo_names_its_line():
    """The wheel's command keeps the line tables of the demo's training
    crate: `snapdiff demo` names the line of `crates/train` it promises,
    not an address."""
    import subprocess

    from snapdiff._cli import binary

    out = subprocess.run([binary(), "demo", "--steps", "20"], capture_output=True,
                         text=True, check=True).stdout
    assert re.search(r"forward  (\S*/)?model\.rs:\d+", out), out
    assert "no frame of your code" not in out, out
    assert not re.search(r"0x[0-9a-f]{6,}", out), out


def test_the_public_functions_are_typed():
    """The package ships `py.typed`: every public function and method of
    what `snapdiff` exports says the types of its parameters and result,
    and they resolve."""
    import inspect
    import typing

    import snapdiff

    untyped = []
    for name in snapdiff.__all__:
        obj = getattr(snapdiff, name)
        if inspect.isclass(obj):
            members = [
                (f"{name}.{m}", getattr(obj, m))
                for m, v in vars(obj).items()
                if not m.startswith("_") and (inspect.isfunction(v) or isinstance(v, property))
            ]
            members = [(n, f.fget if isinstance(f, property) else f) for n, f in members]
        elif inspect.isfunction(obj):
            members = [(name, obj)]
        else:
            continue
        for qualified, function in members:
            if function.__module__.split(".")[0] != "snapdiff":
                continue
            hints = typing.get_type_hints(function)
            params = [p for p in inspect.signature(function).parameters if p != "self"]
            missing = [p for p in params if p not in hints]
            if missing or "return" not in hints:
                untyped.append(f"{qualified}: {missing or 'return'}")
    assert untyped == [], untyped
