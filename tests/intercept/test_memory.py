"""The CPU memory tracker's step peaks: frees by another thread placed at the program's last use."""

import threading

import torch

from prism_rr.intercept.memory import CpuMemoryTracker

MB = 2**20


def _on_thread(fn) -> None:
    t = threading.Thread(target=fn)
    t.start()
    t.join()


def test_owner_frees_count_where_they_happen():
    m = CpuMemoryTracker()
    a = torch.empty(MB // 4)  # 1 MiB
    m.track(a)
    del a
    b = torch.empty(MB // 2)  # 2 MiB, after a was freed
    m.track(b)
    assert m.take_peak() == 2 * MB
    assert m.allocated == 2 * MB
    # The next period starts at what is live.
    assert m.take_peak() == 2 * MB


def test_free_by_another_thread_counts_until_the_last_use():
    """A backend thread holds a buffer the program dropped after its last use and lets go
    later (while the program allocated more): counted until the last use, not until then."""
    m = CpuMemoryTracker()
    buf = torch.empty(MB // 4)  # 1 MiB, the program's, used by one operator
    m.track(buf)
    held = [buf]  # the "backend" keeps it alive
    del buf
    big = torch.empty(MB)  # 4 MiB, allocated after the buffer's last use
    m.track(big)
    _on_thread(held.clear)  # the backend lets go, on its own thread
    assert m.allocated == 4 * MB
    assert m.take_peak() == 4 * MB  # not 5 MiB


def test_touch_extends_the_last_use():
    """A wait() that completed the buffer's call is a use: an allocation before it sees the
    buffer live, one after it does not."""
    m = CpuMemoryTracker()
    buf = torch.empty(MB // 4)
    m.track(buf)
    held = [buf]
    big = torch.empty(MB)
    m.track(big)  # while the call is in flight: both live
    m.touch(buf)  # the wait()
    del buf, big
    after = torch.empty(MB // 2)  # 2 MiB after the wait
    m.track(after)
    _on_thread(held.clear)
    assert m.take_peak() == 5 * MB


def test_touch_from_another_thread_and_of_unseen_tensors_is_ignored():
    m = CpuMemoryTracker()
    buf = torch.empty(MB // 4)
    m.track(buf)
    held = [buf]
    del buf
    _on_thread(lambda: m.touch(held[0]))  # a backend thread's "use" is not the program's
    unseen = torch.empty(MB)
    m.touch(unseen)  # never produced or read by an operator: not counted
    assert m.allocated == MB
    big = torch.empty(MB // 2)
    m.track(big)
    _on_thread(held.clear)
    assert m.take_peak() == 2 * MB


def test_late_free_of_a_buffer_from_an_earlier_step():
    """A buffer last used in an earlier period and let go by another thread in this one
    counts in neither this period's start nor its peak."""
    m = CpuMemoryTracker()
    buf = torch.empty(MB // 4)
    m.track(buf)
    held = [buf]
    del buf
    assert m.take_peak() == MB
    big = torch.empty(MB // 2)
    m.track(big)
    _on_thread(held.clear)
    assert m.take_peak() == 2 * MB
