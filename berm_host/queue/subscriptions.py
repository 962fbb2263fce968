"""Subscriptions: a harness as the target of a topic, so a published event becomes an ``on_notify`` invocation.

RFC 0205 notes the event bus routes to agents only; this record is the missing piece — a subscription whose
target is a harness. ``once`` subscriptions are removed by the first event they receive. Held in memory, and made
only by an embedder (``Queue.subscribe``): how a harness becomes a subscription target is an open question of the
RFC, so declarations hold none and under ``berm serve`` a ``publish`` reaches no harness yet.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import Callable, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Subscription:
    topic: str
    harness: str
    once: bool = False


def notify_args(topic: str, event: str) -> bytes:
    """The argument blob ``on_notify`` pulls: ``{"topic": …, "event": …}``."""
    return json.dumps({"topic": topic, "event": event}, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


class Subscriptions:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._subs: list[Subscription] = []

    def add(self, sub: Subscription) -> None:
        with self._lock:
            if sub not in self._subs:
                self._subs.append(sub)

    def deliver(self, topic: str, send: Callable[[str], T]) -> list[T]:
        """``send(harness)`` for each harness subscribed to ``topic``, once a harness (subscribed both once and for
        good, a harness got each event twice: found by a review). A ``once`` subscription is consumed by a send that
        returned: when one raises (the queue closing), the harnesses not reached keep theirs for the next event
        (they were consumed first, then lost: found by a review). Sends to one topic never interleave."""
        with self._lock:
            harnesses = list(dict.fromkeys(s.harness for s in self._subs if s.topic == topic))
            sent: list[T] = []
            try:
                for harness in harnesses:
                    sent.append(send(harness))
            finally:
                reached = set(harnesses[:len(sent)])
                self._subs = [s for s in self._subs if not (s.once and s.topic == topic and s.harness in reached)]
            return sent

    def list(self) -> list[Subscription]:
        with self._lock:
            return list(self._subs)
