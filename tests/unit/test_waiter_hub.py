"""The waiter hub: wakes oldest first, one per job, everybody on reconnect or shutdown."""

from __future__ import annotations

from app.queue.waiters import ALL_QUEUES, WaiterHub
from app.wakeup.control import decode_payload, encode_payload


async def test_notify_wakes_as_many_as_jobs_oldest_first() -> None:
    hub = WaiterHub()
    waiters = [hub.register(["q"]) for _ in range(5)]
    assert hub.notify("q", 2) == 2
    assert [w.woken for w in waiters] == [True, True, False, False, False]
    assert hub.notify("other", 10) == 0


async def test_waiter_on_two_queues_is_woken_once() -> None:
    hub = WaiterHub()
    both = hub.register(["a", "b"])
    only_b = hub.register(["b"])
    assert hub.notify("a", 1) == 1 and both.woken
    # The wake on b skips the waiter already woken and reaches the next one.
    assert hub.notify("b", 1) == 1 and only_b.woken


async def test_rearm_puts_waiter_back_in_line() -> None:
    hub = WaiterHub()
    first = hub.register(["q"])
    second = hub.register(["q"])
    hub.notify("q", 1)
    hub.rearm(first)
    assert not first.woken
    hub.notify("q", 1)
    assert second.woken and not first.woken


async def test_unregister_and_notify_all() -> None:
    hub = WaiterHub()
    gone = hub.register(["q"])
    stay = [hub.register(["q", "r"]), hub.register(["r"])]
    hub.unregister(gone)
    assert hub.parked == 2
    assert hub.notify_all() == 2 and all(w.woken for w in stay) and not gone.woken


async def test_close_wakes_everybody_and_later_waits_return_at_once() -> None:
    hub = WaiterHub()
    parked = hub.register(["q"])
    hub.close()
    assert parked.woken and hub.closed
    assert hub.register(["q"]).woken


def test_payload_round_trip_keeps_queue_with_separators() -> None:
    payload = encode_payload("inst1", "tenant:emails.v2", 7)
    assert decode_payload(payload) == ("inst1", 7, "tenant:emails.v2")
    assert decode_payload("garbage") is None and decode_payload("a b c") is None


async def test_all_queues_wakes_every_waiter() -> None:
    hub = WaiterHub()
    a, b = hub.register(["a"]), hub.register(["b", "c"])
    assert hub.notify(ALL_QUEUES) == 2
    assert a.woken and b.woken
