"""The event bus: blinker signals in one private ``Namespace`` per host."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

from blinker import Namespace
from pydantic import BaseModel

from .signals import PAYLOADS

__all__ = ["EventBus", "UnknownSignalError", "await_me_maybe"]

log = logging.getLogger("host_stub.bus")

#: The payload model of the send in progress (in this task), handed to typed receivers as it is.
_sending: ContextVar[BaseModel | None] = ContextVar("_sending", default=None)


class UnknownSignalError(KeyError):
    """A signal name that is not one of :data:`host_stub.signals.PAYLOADS`."""


async def await_me_maybe(value: Any) -> Any:
    """Await ``value`` if it is awaitable; the one place that resolves sync-or-async results."""
    if inspect.isawaitable(value):
        return await value
    return value


class EventBus:
    """Signals by name. Receivers are called ``receiver(sender, **payload)``, or, connected with
    ``typed=True``, ``receiver(sender, payload)`` with the signal's payload model (one model per
    send, shared by its typed receivers: to read, not to change); async ones are awaited one
    after another, sync ones wrapped. A receiver that raises is logged and the others
    still run. What a receiver returns is dropped: signals are for observers, and whatever
    answers the host is a hook. Unknown names are refused at connect and at send."""

    def __init__(self, sender: Any = None) -> None:
        self._namespace = Namespace()
        self._sender = sender
        self._wrappers: dict[tuple[str, Callable[..., Any]], Callable[..., Any]] = {}
        for name in PAYLOADS:
            self._namespace.signal(name)

    def _signal(self, name: str) -> Any:
        if name not in PAYLOADS:
            raise UnknownSignalError(f"unknown signal {name!r}; known: {', '.join(PAYLOADS)}")
        return self._namespace.signal(name)

    def connect(self, name: str, receiver: Callable[..., Any], *, typed: bool = False) -> None:
        signal = self._signal(name)
        model = PAYLOADS[name]

        async def isolated(sender: Any, **payload: Any) -> None:
            try:
                if typed:  # the model send validated (or the sender built): not built again
                    event = _sending.get()
                    if type(event) is not model:
                        event = model.model_construct(**payload)
                    await await_me_maybe(receiver(sender, event))
                else:
                    await await_me_maybe(receiver(sender, **payload))
            except Exception:
                log.exception("receiver %r of %s failed", receiver, name)

        self._wrappers[(name, receiver)] = isolated
        # weak=False: a bound method of a plugin must not vanish while the host runs.
        signal.connect(isolated, weak=False)

    def disconnect(self, name: str, receiver: Callable[..., Any]) -> None:
        wrapper = self._wrappers.pop((name, receiver), None)
        if wrapper is not None:
            self._signal(name).disconnect(wrapper)

    def receivers(self, name: str) -> int:
        return len(self._signal(name).receivers)

    async def send(self, name: str, built: BaseModel | None = None, /, **payload: Any) -> None:
        """Validate ``payload`` against the signal's model, then await every receiver; what they
        return is dropped. A sender that built the payload model itself passes it instead
        (``built``: not validated again; receivers get its field values, to read, not to
        change)."""
        signal = self._signal(name)
        model = built
        if model is None:
            model = PAYLOADS[name].model_validate(payload)
        elif payload or type(model) is not PAYLOADS[name]:
            raise TypeError(f"{name}: pass one {PAYLOADS[name].__name__} or its fields")
        # Pass field values, not a dump: one model, read by every receiver.
        kwargs = {field: getattr(model, field) for field in type(model).model_fields}
        token = _sending.set(model)
        try:
            await signal.send_async(self._sender, **kwargs)
        finally:
            _sending.reset(token)
