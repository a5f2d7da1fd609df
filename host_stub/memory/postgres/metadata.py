"""Metadata records and leases."""

from __future__ import annotations

from typing import Any

from ...services import (
    LeaseLost,
    LeaseToken,
    MetadataEntry,
)
from ...session_ids import check_session_id
from ..common import (
    check_ttl,
    dump_value,
    new_lease_token,
)
from .rows import _CLOCK, _entry
from .statements import _Statements


class _MetadataAndLeases(_Statements):
    # -- metadata -----------------------------------------------------------------------------

    async def get_metadata(self, namespace: str, key: str) -> MetadataEntry | None:
        async with self._conn() as conn:
            return await self._metadata(conn, namespace, key)

    async def save_metadata(
        self,
        namespace: str,
        key: str,
        value: dict[str, Any],
        expected_version: int | None = None,
    ) -> int | None:
        check_session_id(key)
        if value is None:
            raise ValueError("save_metadata needs a value; use delete_metadata to delete")
        text = dump_value(value)
        async with self._conn() as conn:
            return await self._write_metadata(conn, namespace, key, text, expected_version)

    async def delete_metadata(
        self, namespace: str, key: str, expected_version: int | None = None
    ) -> int | None:
        async with self._conn() as conn:
            return await self._write_metadata(conn, namespace, key, None, expected_version)

    async def list_metadata(self, namespace: str) -> list[MetadataEntry]:
        async with self._conn() as conn:
            rows = await conn.fetch(
                self.sql(
                    "SELECT namespace, key, value, version, deleted, updated_at FROM {p}metadata"
                    ' WHERE namespace = $1 AND NOT deleted ORDER BY key COLLATE "C"'
                ),
                namespace,
            )
        return [_entry(r) for r in rows]

    # -- leases -------------------------------------------------------------------------------

    async def acquire_lease(self, name: str, ttl_s: float) -> LeaseToken | None:
        check_ttl(ttl_s)
        token = new_lease_token()
        async with self._conn() as conn:
            # Taken when free or expired (by the server's clock); a live lease is left alone. A
            # concurrent taker waits for the row lock, then sees the new expiry and gets nothing.
            # The row outlives releases, so its fence only grows.
            row = await conn.fetchrow(
                self.sql(
                    "INSERT INTO {p}leases AS l (name, token, expires_at, fence)"
                    f" VALUES ($1, $2, {_CLOCK} + $3::float8, 1)"
                    " ON CONFLICT (name) DO UPDATE"
                    " SET token = excluded.token, expires_at = excluded.expires_at,"
                    " fence = l.fence + 1"
                    f" WHERE l.expires_at <= {_CLOCK}"
                    " RETURNING expires_at, fence"
                ),
                name,
                token,
                float(ttl_s),
            )
        if row is None:
            return None
        return LeaseToken(
            name=name, token=token, expires_at=float(row["expires_at"]), fence=int(row["fence"])
        )

    async def renew_lease(self, lease: LeaseToken, ttl_s: float) -> LeaseToken | None:
        check_ttl(ttl_s)
        async with self._conn() as conn:
            expires_at = await conn.fetchval(
                self.sql(
                    f"UPDATE {{p}}leases SET expires_at = {_CLOCK} + $3::float8"
                    f" WHERE name = $1 AND token = $2 AND expires_at > {_CLOCK}"
                    " RETURNING expires_at"
                ),
                lease.name,
                lease.token,
                float(ttl_s),
            )
        if expires_at is None:
            return None
        return lease.model_copy(update={"expires_at": float(expires_at)})

    async def release_lease(self, lease: LeaseToken) -> bool:
        async with self._conn() as conn:
            # The row stays (its fence is the next holder's base); only the holder is removed.
            gone = await conn.fetchval(
                self.sql(
                    "UPDATE {p}leases SET token = '', expires_at = 0"
                    " WHERE name = $1 AND token = $2 RETURNING 1"
                ),
                lease.name,
                lease.token,
            )
        return gone is not None

    async def _check_fence(self, conn: Any, lease: LeaseToken | None) -> None:
        """In a write's transaction: raise :class:`LeaseLost` if a newer holder took ``lease``.
        The row stays share-locked to the commit, so no acquisition can slip in between."""
        if lease is None:
            return
        fence = await conn.fetchval(
            self.sql("SELECT fence FROM {p}leases WHERE name = $1 FOR SHARE"), lease.name
        )
        if (fence or 0) != lease.fence:
            raise LeaseLost(lease)
