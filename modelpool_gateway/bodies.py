"""The memory the request bodies inside the gateway hold together, bounded.

Each body is bounded (``max_request_bytes``) and so is the number of requests inside (``max_in_flight``),
but their product is not a bound anyone can give a gateway memory for (4096 x 16 MiB is 64 GiB, against
the chart's 512 MiB). ``BodyBytes`` is the sum of the bodies held now (``max_body_bytes_in_flight``): a
request takes its share as its body arrives (all of a declared Content-Length at once, before a byte is
read; else chunk by chunk) and gives it back when it ends, relayed or refused. One that would pass the
sum is answered 429 at once (``bodies_full``) and costs nothing more; the others go on.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Ticket:
    """One request's share of the bodies' memory (bytes taken so far)."""

    taken: int = 0


@dataclass
class BodyBytes:
    """The bytes of request bodies held in the gateway now, at most ``limit``."""

    limit: int
    used: int = 0

    def take(self, ticket: Ticket, size: int) -> bool:
        """Take ``size`` more bytes for ``ticket``'s request; False (nothing taken) past the limit."""
        if self.used + size > self.limit:
            return False
        self.used += size
        ticket.taken += size
        return True

    def give_back(self, ticket: Ticket) -> None:
        """The request ended: its bytes are free."""
        self.used -= ticket.taken
        ticket.taken = 0
