"""An async iterator that starts fetching its first item at once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, TypeVar

T = TypeVar("T")
_END: Any = object()


class Prefetched(AsyncIterator[T]):
    """An async iterator whose first item is fetched in the background from the start, so
    the work that fetch begins (the request to the tier) overlaps with the caller's."""

    def __init__(self, iterator: AsyncIterator[T]) -> None:
        self._iterator = iterator
        self._first: asyncio.Future[T] | None = asyncio.ensure_future(anext(iterator, _END))

    async def __anext__(self) -> T:
        if self._first is not None:
            first, self._first = self._first, None
            item = await first
            if item is _END:
                raise StopAsyncIteration
            return item
        return await anext(self._iterator)

    async def aclose(self) -> None:
        if self._first is not None and not self._first.done():
            self._first.cancel()
            await asyncio.wait({self._first})
        closer = getattr(self._iterator, "aclose", None)
        if closer is not None:
            await closer()
