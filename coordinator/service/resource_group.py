"""The Spider resource group the coordinator registers jobs under (``docs/clp.md``, Tables).

Where the id lives depends on the engine:

* **The embedded engine** (in-process; ``coordinator spider serve`` hosts the same engine) keeps
  its groups in its own table, ``spider_engine_resource_groups``, with a unique name, and offers a
  get-or-create by name (``EmbeddedSpider.resource_group_by_name``, the ``NamedResourceGroups``
  capability). The group is resolved there, race-safe between replicas sharing a database, and
  CLP's ``spider_resource_groups`` is **never read or written**: a row CLP (or a Spider cluster)
  recorded there stays byte for byte what it was, and one the engine cannot verify neither is
  deleted nor holds up any job.
* **A Spider cluster over gRPC** (``GrpcSpider``, any port without that capability): Spider cannot
  look a group up by name, so, as CLP's Rust coordinator does, its id lives in
  ``spider_resource_groups``. Get-or-create: read the row; if there is none,
  ``AddResourceGroup(name, password = name)`` and insert the row. Improvements on CLP's
  coordinator:

  * **Stale id** (hazard H11, ``docs/hazards.md``): a stored id is checked with
    ``VerifyResourceGroup``; when Spider's storage was reset it answers ``Unauthenticated``, and the
    group is registered again and the row replaced. ``invalidate()`` forces the same check after a
    RegisterJob answered ``Unauthenticated``.
  * **Two coordinators registering at once**: the loser's insert (or Spider's ``ALREADY_EXISTS``)
    makes it read the winner's row instead of failing.
  * **A registration whose id was never recorded** (the coordinator died, or the database went
    away, between ``AddResourceGroup`` and the insert; or the reply was lost): Spider knows the
    name, nothing records the id, and Spider has no lookup by name. The id is found by asking
    ``VerifyResourceGroup(id, password = name)`` for ids 1, 2, … up to
    ``RESOURCE_GROUP_PROBE_LIMIT`` (Spider numbers groups from 1, and only the group registered
    under this name has this password), then recorded. Only when no id answers (the name was
    registered with another password, or its id is beyond the limit) is it an error, which names
    the table to fix.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Protocol

from sqlalchemy import Engine, delete, insert, select
from sqlalchemy.exc import IntegrityError

from coordinator.errors import CoordinatorError
from coordinator.spider.port import ResourceGroupExists, SpiderPort, Unauthenticated
from coordinator.store.database import reading
from coordinator.store.schema import spider_resource_groups as _groups

RESOURCE_GROUP_PROBE_LIMIT = 1024
"""How many ids are tried to find a group Spider has under the name but no row records."""


class ResourceGroupUnavailable(CoordinatorError, RuntimeError):
    """The group's id cannot be known: Spider has the name but no row records its id (gRPC), or
    the engine has the name under another password (embedded)."""


class NamedResourceGroups(Protocol):
    """An engine that resolves a resource group by name itself (the embedded engine)."""

    def resource_group_by_name(self, external_id: str, password: bytes) -> int:
        """The group's id, created when missing; ``Unauthenticated`` for another password."""
        ...


def lookup_by_name(spider: object) -> Callable[[str, bytes], int] | None:
    """``spider``'s ``resource_group_by_name`` when it has one (the embedded engine, or a wrapper
    passing it on), else ``None`` (a Spider cluster: the id must be kept in CLP's table)."""
    lookup = getattr(spider, "resource_group_by_name", None)
    return lookup if callable(lookup) else None


class ResourceGroup:
    """The id of the resource group ``name``: resolved once, re-checked when Spider rejects it."""

    def __init__(self, engine: Engine, spider: SpiderPort, name: str) -> None:
        self.engine = engine
        self.spider = spider
        self.name = name
        self._id: int | None = None
        self._resolving = threading.Lock()  # the loop submits several jobs at once

    @property
    def password(self) -> bytes:
        """CLP uses the name's bytes (Spider does not check it on RegisterJob yet)."""
        return self.name.encode()

    def id(self) -> int:
        """The id, registering the group when needed.

        Raises ``ResourceGroupUnavailable`` (see the module) and the port's transport errors.
        """
        with self._resolving:
            if self._id is None:
                self._id = self._resolve()
            return self._id

    def invalidate(self) -> None:
        """Forget the cached id: the next ``id()`` verifies (and if need be replaces) it."""
        self._id = None

    @property
    def uses_clp_table(self) -> bool:
        """Whether the id is kept in CLP's ``spider_resource_groups`` (a Spider cluster)."""
        return lookup_by_name(self.spider) is None

    def _resolve(self) -> int:
        lookup = lookup_by_name(self.spider)
        if lookup is not None:
            try:
                return lookup(self.name, self.password)
            except Unauthenticated as error:
                raise ResourceGroupUnavailable(
                    f"the engine's resource group {self.name!r} has another password: {error}"
                ) from error
        for _ in range(3):
            stored = self.stored_id()
            if stored is not None:
                try:
                    self.spider.verify_resource_group(stored, self.password)
                    return stored
                except Unauthenticated:
                    self._forget(stored)  # Spider's storage was reset: register anew
            try:
                new_id = self.spider.add_resource_group(self.name, self.password)
            except ResourceGroupExists:
                time.sleep(0.2)  # another coordinator is registering it; read its row
                continue
            recorded = self._record(new_id)
            if recorded is not None:
                return recorded
        found = self._find_unrecorded()
        if found is not None:
            recorded = self._record(found)
            stored = recorded if recorded is not None else self.stored_id()
            if stored is not None:
                return stored
        raise ResourceGroupUnavailable(
            f"Spider already has the resource group {self.name!r} but spider_resource_groups "
            f"records no id for it, and no id up to {RESOURCE_GROUP_PROBE_LIMIT} verifies with "
            "its password; insert its id there (or reset Spider's storage)"
        )

    def _record(self, group_id: int) -> int | None:
        """Record ``group_id`` as the name's id; ``None`` when another coordinator recorded one
        first (read it on the next round)."""
        try:
            with self.engine.begin() as connection:
                connection.execute(insert(_groups).values(rg_name=self.name, rg_id=group_id))
        except IntegrityError:
            return None
        return group_id

    def _find_unrecorded(self) -> int | None:
        """The id of the group Spider has under this name, found by ``VerifyResourceGroup``
        (only it has this password); ``None`` when no id up to the limit verifies.

        Raises the port's transport errors.
        """
        for candidate in range(1, RESOURCE_GROUP_PROBE_LIMIT + 1):
            try:
                self.spider.verify_resource_group(candidate, self.password)
            except Unauthenticated:
                continue
            return candidate
        return None

    def stored_id(self) -> int | None:
        """The id ``spider_resource_groups`` records for the name (a Spider cluster's), or
        ``None``; only reads. Raises the driver's errors."""
        with reading(self.engine) as connection:
            value = connection.execute(
                select(_groups.c.rg_id).where(_groups.c.rg_name == self.name)
            ).scalar_one_or_none()
        return None if value is None else int(value)

    def _forget(self, stale_id: int) -> None:
        with self.engine.begin() as connection:
            connection.execute(
                delete(_groups).where(_groups.c.rg_name == self.name, _groups.c.rg_id == stale_id)
            )
