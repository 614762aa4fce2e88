"""The innermost open scope of the running thread or asyncio task.

A ``ContextVar`` holds the innermost :class:`~tidyjax._scope.Scope`; each scope links to its
parent, so the stack is an immutable linked list. A new thread starts with no scope; an asyncio
task starts with the scope that was current where it was created (ordinary ``contextvars``
semantics) and its own ``async with tidy()`` never affects another task.
"""

from __future__ import annotations

import contextvars
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._scope import Scope

CURRENT: contextvars.ContextVar[Scope | None] = contextvars.ContextVar(
    "tidyjax_scope", default=None
)
