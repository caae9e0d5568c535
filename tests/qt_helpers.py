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


def shutdown_returns_while_held(loop, service, job, entered, release) -> None:
    """With `job` (a task) held inside a step (`entered` set, waiting for `release`), `service.shutdown(timeout)`
    returns False at once, before the step is let go; released, the job ends with False (given up) and a second
    shutdown finds the worker ended."""
    try:
        assert run_until(loop, entered.is_set, 30)
        assert service.shutdown(timeout=0.2) is False and not release.is_set()  # back while the job is held
    finally:
        release.set()
    assert run_until(loop, job.done, 60) and job.result() is False
    assert service.shutdown(timeout=60) is True
