"""Replaying a trace: which requests to hand the engine, and when."""

from __future__ import annotations

from specrl.workload.trace import Request, Trace


class TraceDriver:
    """Admits the requests of a trace, in order, into whatever serves them.

    Closed loop: keeps ``trace.concurrency(completed)`` requests in flight. Open loop: admits
    every request whose ``arrival_s`` has passed on the serving clock; when nothing is in
    flight and the next arrival is in the future, the clock jumps to it (idle time is not
    serving time and no policy could use it, so it is skipped rather than counted).
    """

    def __init__(self, trace: Trace):
        self.trace = trace
        self._n = len(trace.requests)
        if trace.closed_loop:
            self._target = [trace.concurrency(c) for c in range(self._n + 1)]
        else:
            self._arrivals = [r.arrival_s for r in trace.requests]
        self.reset()

    def reset(self) -> None:
        self.next_index = 0
        self.completed = 0
        self.in_flight = 0
        self.clock_s = 0.0
        self.idle_s = 0.0

    @property
    def done(self) -> bool:
        return self.completed == self._n

    def due(self) -> list[Request]:
        """Requests to admit now; call after every step (and once after reset)."""
        n, i = self._n, self.next_index
        if i == n:
            return []
        if self.trace.closed_loop:
            j = min(n, i + max(0, self._target[self.completed] - self.in_flight))
            if j == i and self.in_flight == 0:
                j = i + 1  # a schedule may never leave the server idle
        else:
            if self.in_flight == 0 and self._arrivals[i] > self.clock_s:
                self.idle_s += self._arrivals[i] - self.clock_s
                self.clock_s = self._arrivals[i]
            j = i
            while j < n and self._arrivals[j] <= self.clock_s:
                j += 1
        if j == i:
            return []
        self.next_index = j
        self.in_flight += j - i
        return self.trace.requests[i:j]

    def advance(self, seconds: float, finished: int) -> None:
        """Account for one step: ``seconds`` of serving, ``finished`` requests completed."""
        self.clock_s += seconds
        self.completed += finished
        self.in_flight -= finished
