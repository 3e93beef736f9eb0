"""The packages are found, not listed: the four folders of the source tree map into the ``xsearch``
namespace (``compress/`` is ``xsearch.compress``, ...), and every package inside them is included.
Everything else about the distribution is in pyproject.toml."""

from setuptools import find_packages, setup

ROOTS = {"xsearch": "xsearch", "xsearch.compress": "compress", "xsearch.export": "export",
         "xsearch.search_spaces": "search_spaces"}  # fmt: skip


def packages() -> list[str]:
    found = []
    for name, folder in ROOTS.items():
        found += [name, *(f"{name}.{sub}" for sub in find_packages(folder))]
    return found


setup(packages=packages(), package_dir=ROOTS)
