"""Driving the qasync loop from tests until a condition holds."""
import asyncio


def run_until(loop, predicate, timeout=60.0):
    async def wait():
        for _ in range(int(timeout / 0.02)):
            if predicate():
                return True
            await asyncio.sleep(0.02)
        return False

    return loop.run_until_complete(wait())
