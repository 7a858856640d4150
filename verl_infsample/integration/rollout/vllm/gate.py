"""The server's gate into vLLM: what is inside it, and the probes' rests held until it has room.

``VLLMRequestOrder`` (pure, shared with the replay) counts the requests inside vLLM and ranks the held rests;
``EngineGate`` is the one place the server changes that count and waits on it: every request goes in through
``inside`` (counted in, and out however it returns), a held rest waits in ``turn`` until ``release`` lets it in
(counted in by the order as it leaves the hold) or ``abort`` answers it. Everything runs on the server's event loop.
The time spent in the order's work (predictions, ranking, the held rests) is the gate's to count (``planning``): the
server's event loop feeds vLLM nothing meanwhile.
"""

from __future__ import annotations

import asyncio
import time
from contextlib import contextmanager

from .order import OrderedRequest, VLLMRequestOrder


class EngineGate:
    def __init__(self, order: VLLMRequestOrder):
        self.order = order
        self.plan_ms = 0.0  # time in the order's work since the last ``pop_plan_ms`` (``infsample/plan_ms``)
        self._turns: dict[int, asyncio.Future] = {}  # id of a held request -> its turn (True: released)

    @contextmanager
    def planning(self):
        """Around the order's work, the gate's own and the server's (arrivals, probes, finished samples)."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.plan_ms += (time.perf_counter() - start) * 1e3

    def pop_plan_ms(self) -> float:
        ms, self.plan_ms = self.plan_ms, 0.0
        return ms

    @contextmanager
    def inside(self, released: bool = False):
        """A request inside vLLM for the block's duration (``released``: a held rest, counted in by ``release``)."""
        if not released:
            self.order.enter()
        try:
            yield
        finally:
            self.order.leave()

    async def turn(self, request: OrderedRequest) -> tuple[bool, bool]:
        """Hold ``request``'s rest until the order releases it. Returns (released, waited): released False when an
        abort dropped it; waited False when it went straight in. If its caller goes away meanwhile, it leaves the
        hold (or, released and never sent, leaves vLLM's count) and the cancellation goes on."""
        with self.planning():
            self.order.hold(request)
        turn = self._turns[id(request)] = asyncio.get_running_loop().create_future()
        self.release()
        waited = not turn.done()
        try:
            return await turn, waited
        except asyncio.CancelledError:  # its caller went away: it no longer waits, or no longer runs
            self._turns.pop(id(request), None)
            if self.order.withdraw(request) is None and turn.done() and not turn.cancelled() and turn.result():
                self.order.leave()  # released, never sent
            raise

    def release(self) -> None:
        """The held rests the order releases now go into vLLM."""
        with self.planning():
            released = self.order.release()
        for request in released:
            turn = self._turns.pop(id(request))
            if not turn.done():
                turn.set_result(True)

    def widen(self, by: int) -> None:
        """vLLM had ``by`` slots free with nothing waiting in it while rests were held: let that many more in."""
        self.order.widen(by)
        self.release()

    def abort(self) -> None:
        """Every held rest is answered: not released (its caller returns its probe's tokens, "aborted")."""
        for request in self.order.drop_held():
            turn = self._turns.pop(id(request), None)
            if turn is not None and not turn.done():
                turn.set_result(False)
