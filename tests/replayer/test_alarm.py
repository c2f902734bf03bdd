"""The replayer's alarm thread (which completes a virtual call's future at its time) lets
go of what it called at once, as a real backend's thread drops a call's tensors once the
call completed: the memory tracker counts a storage until its last reference goes."""

import threading
import weakref
from time import monotonic_ns

from prism_rr.replayer._session import _Alarm


class _Held:
    pass


def test_the_alarm_lets_go_of_a_function_once_it_ran():
    alarm = _Alarm()
    ran, gone = threading.Event(), threading.Event()
    held = _Held()  # stands for a Work's tensors, held by its _fire
    weakref.finalize(held, gone.set)
    alarm.at(monotonic_ns() + 20_000_000, lambda held=held: ran.set())
    del held
    assert ran.wait(5)
    # No other alarm comes: before the fix the thread kept the last function it ran (and a
    # DDP bucket with it) until the next one, a step later in a replay of DDP.
    assert gone.wait(2), "the alarm thread still holds the function it ran"


def test_an_alarm_due_already_runs_on_the_caller():
    alarm = _Alarm()
    on = []
    alarm.at(0, lambda: on.append(threading.get_ident()))
    assert on == [threading.get_ident()]
