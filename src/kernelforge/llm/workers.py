"""The threads requests run on while the device evaluates."""

from __future__ import annotations

import queue
import threading
from concurrent.futures import Future


class RequestThreads:
    """A few daemon threads running requests: unlike a ThreadPoolExecutor, a request still waiting
    on a slow server never holds up the exit of an interrupted search."""

    def __init__(self, count: int):
        self._queue: queue.Queue = queue.Queue()
        self._threads = [threading.Thread(target=self._work, daemon=True, name=f"kf-llm-{i}") for i in range(count)]
        for thread in self._threads:
            thread.start()

    def submit(self, fn, *args) -> Future:
        future: Future = Future()
        self._queue.put((future, fn, args))
        return future

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            future, fn, args = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args))
            except BaseException as exc:  # handed to the search thread, which records it
                future.set_exception(exc)

    def close(self) -> None:
        for _ in self._threads:
            self._queue.put(None)
