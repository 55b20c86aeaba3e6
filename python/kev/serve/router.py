"""State affinity for Ray Serve: a ``RequestRouter`` that sends a request to the replica most likely to hold
its state's prepared prefix (or its pinned state), on a consistent-hash ring of the replicas.

The rule, per request (``KevCall`` in ``pending_request.args``):

1. ``replica`` named (the ``X-Kev-Replica`` request header, to ask one replica its ``/metrics``) and that
   replica is live → that replica alone.
2. A pinned state's id names the replica that made it (its id starts ``<replica>-``). Live → that replica
   alone, whatever its load: only it holds the pin. Gone → any replica (as 4), whose server answers the
   contract's 404 for an id it does not hold — never another state's answer.
3. A state key → its *home*, the first replica clockwise of the key on the ring (``vnodes`` points per
   replica): consistent hashing, so a replica that joins or leaves moves only its own share of states. The
   home is chosen unless it has more than ``imbalance`` requests in flight beyond the least-loaded replica
   (the handle's queue-length cache, which Ray keeps from replica probes and its own sends): then the
   least-loaded replica (or the home's next two on the ring, whichever is lighter). When the home is full
   (``max_ongoing_requests``) its next two on the ring, then any replica. So a hot state spills onto two more
   replicas before it spreads, and the replicas probed per request stay few however large the fleet. A state
   that moves costs one cache miss there, never a different answer (cached and uncached states give the same
   bits).
4. No key (``/v1/models``, ``/health``, a body that does not parse) → the lighter of two replicas drawn at
   random (Ray's default rule).

Ranks go back to Ray, which takes the least-loaded replica of the first rank that has room (probing the ones
whose queue length it does not know), so Ray's own back-pressure (``max_ongoing_requests``) and its handling
of dead replicas apply unchanged.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import logging
import random
from typing import Dict, Iterable, List, Optional

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

logger = logging.getLogger("ray.serve")


def point(text: str) -> int:
    """A stable 64-bit position on the ring (the same in every process, unlike ``hash``)."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "big")


class HashRing:
    """Replicas on a ring of 2^64 positions, ``vnodes`` points each; a key belongs to the first point at or
    after it (wrapping round)."""

    def __init__(self, vnodes: int = 128) -> None:
        self.vnodes = max(1, int(vnodes))
        self._points: List[int] = []
        self._owners: List[str] = []
        self._members: frozenset = frozenset()

    @property
    def members(self) -> frozenset:
        return self._members

    def rebuild(self, members: Iterable[str]) -> None:
        members = frozenset(members)
        if members == self._members:
            return
        pairs = sorted((point(f"{m}#{i}"), m) for m in members for i in range(self.vnodes))
        self._points = [p for p, _ in pairs]
        self._owners = [m for _, m in pairs]
        self._members = members

    def walk(self, key: int) -> Iterable[str]:
        """The members in ring order from ``key``: the home first, then where its states would go next."""
        n = len(self._points)
        if n == 0:
            return
        seen = set()
        start = bisect.bisect_left(self._points, key % (1 << 64))
        for i in range(n):
            owner = self._owners[(start + i) % n]
            if owner not in seen:
                seen.add(owner)
                yield owner
                if len(seen) == len(self._members):
                    return

    def home(self, key: int, among: Optional[Iterable[str]] = None) -> Optional[str]:
        allowed = None if among is None else set(among)
        for owner in self.walk(key):
            if allowed is None or owner in allowed:
                return owner
        return None


def pin_owner(pin_id: Optional[str]) -> Optional[str]:
    """The replica a pinned-state id names (``<replica>-<id>``), if it names one."""
    if not pin_id or "-" not in pin_id:
        return None
    return pin_id.split("-", 1)[0] or None


class StateAffinityRouter(RequestRouter):
    """Consistent hashing of a request's state (or pinned-state id) to a replica, least-loaded past an
    imbalance bound. See the module's docstring for the rule."""

    def initialize_state(self, imbalance: int = 8, vnodes: int = 128) -> None:
        self.imbalance = int(imbalance)
        self.ring = HashRing(vnodes)

    # Ray calls these as replicas come and go; the ring follows.
    def update_replicas(self, replicas: List[RunningReplica]) -> None:
        super().update_replicas(replicas)
        self._sync_ring()

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self._sync_ring()

    def _sync_ring(self) -> None:
        if not hasattr(self, "ring"):  # `initialize_state` not called yet
            self.initialize_state()
        self.ring.rebuild(r.unique_id for r in self._replica_id_set)

    def _load(self, replica: RunningReplica) -> Optional[int]:
        return self._replica_queue_len_cache.get(replica.replica_id)

    async def choose_replicas(
        self,
        candidate_replicas: List[RunningReplica],
        pending_request: Optional[PendingRequest] = None,
    ) -> List[List[RunningReplica]]:
        if not candidate_replicas:
            return []
        if not hasattr(self, "ring"):
            self._sync_ring()
        call = _call_of(pending_request)
        by_tag: Dict[str, RunningReplica] = {r.replica_id.unique_id: r for r in candidate_replicas}
        if call is not None and call.replica and call.replica in by_tag:
            return [[by_tag[call.replica]]]
        owner = pin_owner(call.pin) if call is not None else None
        if owner is not None and owner in by_tag:
            return [[by_tag[owner]]]
        if call is None or call.key is None or owner is not None:
            # No state to follow, or a pin whose replica is gone: the lighter of two at random (Ray's own
            # rule; the latter answers 404 for the id, as kev serve does for a pin it does not hold).
            return [random.sample(candidate_replicas, min(2, len(candidate_replicas))), candidate_replicas]
        # The home and the next two replicas clockwise (where the state goes when its home is busy, so a
        # hot state spreads over a few replicas, not all).
        nearest = [by_tag[t] for t in itertools.islice((t for t in self.ring.walk(call.key) if t in by_tag), 3)]
        if not nearest:
            return [candidate_replicas]
        home, spill = nearest[0], nearest[1:]
        known = {r.replica_id: self._load(r) for r in candidate_replicas}
        loads = [x for x in known.values() if x is not None]
        home_load = known.get(home.replica_id)
        if home_load is not None and loads and home_load - min(loads) > self.imbalance:
            least = min((r for r in candidate_replicas if known[r.replica_id] is not None), key=lambda r: known[r.replica_id])
            return [[least, *[r for r in spill if r is not least]], candidate_replicas]
        return [[home], spill, candidate_replicas] if spill else [[home], candidate_replicas]


def _call_of(pending_request: Optional[PendingRequest]):
    if pending_request is None:
        return None
    for arg in pending_request.args or ():
        if hasattr(arg, "key") and hasattr(arg, "pin"):
            return arg
    return None
