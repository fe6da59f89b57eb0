"""An asyncio loop woken by its own worker thread, as servers that hand work to threads are.

Prints READY once the loop runs (its self-pipe, a socketpair, exists then),
waits for "go" on stdin, then for 1 s a thread calls call_soon_threadsafe()
every 5 ms: each call writes a byte to one end of the loop's socketpair and
the loop reads it from the other. Prints "done N" with the wake-ups counted.
"""

import asyncio
import sys
import threading
import time


async def main() -> None:
    loop = asyncio.get_running_loop()
    woken = 0
    finished = asyncio.Event()

    def tick() -> None:
        nonlocal woken
        woken += 1

    def worker() -> None:
        sys.stdin.readline()  # "go": the tracer is attached
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            loop.call_soon_threadsafe(tick)
            time.sleep(0.005)
        loop.call_soon_threadsafe(finished.set)

    threading.Thread(target=worker, daemon=True).start()
    print("READY", flush=True)
    await finished.wait()
    print(f"done {woken}", flush=True)
    sys.stdin.readline()  # stays up, its socketpair open, until told to exit


asyncio.run(main())
