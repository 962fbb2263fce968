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

    def take(self, topic: str) -> list[Subscription]:
        """The subscriptions an event on ``topic`` is delivered to, one a harness (subscribed both once and for
        good, a harness got each event twice: found by a review); ``once`` ones are consumed."""
        with self._lock:
            hits: dict[str, Subscription] = {}
            for s in self._subs:
                if s.topic == topic:
                    hits.setdefault(s.harness, s)
            self._subs = [s for s in self._subs if not (s.once and s.topic == topic)]
            return list(hits.values())

    def list(self) -> list[Subscription]:
        with self._lock:
            return list(self._subs)
