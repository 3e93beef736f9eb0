"""The distribution users install (`pip install .`, a wheel) holds every package and data file of the source tree."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Source folder -> the package it is installed as (pyproject.toml + setup.py map them).
ROOTS = {"xsearch": "xsearch", "compress": "xsearch.compress", "export": "xsearch.export",
         "search_spaces": "xsearch.search_spaces"}  # fmt: skip


def source_packages() -> set[str]:
    """Every folder of the four roots that holds an ``__init__.py``, by its installed name."""
    out = set()
    for folder, name in ROOTS.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder).parts
            out.add(".".join((name, *rel)))
    return out


def test_the_wheel_holds_every_package_and_data_file_of_the_source_tree(tmp_path):
    src = tmp_path / "src"
    for item in (*ROOTS, "pyproject.toml", "setup.py", "README.md"):
        path = ROOT / item
        if path.is_dir():
            shutil.copytree(path, src / item, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(path, src / item)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(tmp_path / "dist"), str(src)], check=True, capture_output=True)  # fmt: skip
    (wheel,) = (tmp_path / "dist").glob("xsearch-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    in_wheel = {str(Path(n).parent).replace("/", ".") for n in names if n.endswith("/__init__.py")}
    assert source_packages() - in_wheel == set(), "packages missing from the wheel"
    assert "xsearch.pipeline" in in_wheel and "xsearch.latency.targets" in in_wheel
    modules = {n for n in names if n.endswith(".py")}
    for folder, name in ROOTS.items():  # every module, not only the packages
        for py in (ROOT / folder).rglob("*.py"):
            if "__pycache__" not in py.parts:
                installed = "/".join((*name.split("."), *py.relative_to(ROOT / folder).parts))
                assert installed in modules, f"{installed} missing from the wheel"
    spaces = {Path(n).name for n in names if n.startswith("xsearch/search_spaces/") and n.endswith(".yaml")}
    assert spaces == {p.name for p in (ROOT / "search_spaces").glob("*.yaml")}
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "xsearch = xsearch.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()
