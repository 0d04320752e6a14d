"""The one build setting ``pyproject.toml`` cannot express: the migrations inside the package.

The repository keeps alembic's usual layout (``migrations/`` and ``alembic.ini`` at the top, so
``alembic upgrade head`` works from the checkout), while an installed wheel must carry the revisions
as a package resource (``coordinator.store.migrate.PACKAGED_MIGRATIONS``). setuptools'
``package_dir`` maps the folder to ``coordinator.migrations`` at build time: the ordinary
``build_py`` copies it, no custom build step, no copy or symlink in the tree. ``pyproject.toml``
alone could map it only with a hand-kept list of every package (its ``packages.find`` cannot add a
mapped one), so the packages are found here and everything else stays in ``pyproject.toml``.

``alembic`` loads ``env.py`` and the revisions by path, so ``migrations/`` needs no
``__init__.py`` (the two are namespace packages in the wheel).
"""

from setuptools import find_namespace_packages, setup

MIGRATIONS = ["coordinator.migrations", "coordinator.migrations.versions"]

setup(
    packages=[*find_namespace_packages(include=["coordinator*"]), *MIGRATIONS],
    package_dir={MIGRATIONS[0]: "migrations"},
)
