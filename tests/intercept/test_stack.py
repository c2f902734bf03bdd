"""A call's stack: the C walk (prism_rr._speedups, where built) names the frames the
Python walk names, from anywhere a program calls."""

import pytest

from prism_rr.intercept import stack

pytestmark = pytest.mark.skipif(stack.fast_walk is None, reason="the C speedups were not built here")


def _walks(depth: int, skip: int, monkeypatch) -> tuple:
    """(the Python walk's stack, the C walk's) of the caller's frames, asked as the
    recorder asks, all from one line of this function."""
    real = stack.fast_walk
    got = []

    def c_walk(depth, skip, *caches):  # one frame more than caller_stack's own call
        got.append(real(depth, skip + 1, *caches))
        return got[-1]

    out = {}
    for walk in ("python", "learn", "c"):  # the C walk after the Python one learnt the frames
        with monkeypatch.context() as m:
            m.setattr(stack, "fast_walk", None if walk == "python" else c_walk)
            out[walk] = stack.caller_stack(depth, skip + 1)
    assert got[-1] is not False  # the C walk answered itself
    return out["python"], out["c"]


def _outer(depth, skip, monkeypatch, n=0):
    if n:
        return _outer(depth, skip, monkeypatch, n - 1)
    return _inner(depth, skip, monkeypatch)


def _inner(depth, skip, monkeypatch):
    return _walks(depth, skip, monkeypatch)


@pytest.mark.parametrize("depth", [1, 2, 4, 8])
@pytest.mark.parametrize("skip", [0, 1, 2])
def test_the_c_walk_names_the_frames_the_python_walk_names(depth, skip, monkeypatch):
    python, fast = _outer(depth, skip, monkeypatch, n=3)
    assert python is not None and fast is not False
    assert fast == python
    assert len(python) >= min(depth, 7 - skip)  # _walks, _inner, _outer x 4, the test: at least


def test_from_generators_lambdas_methods_and_deep_recursion(monkeypatch):
    def gen():
        yield _outer(4, 1, monkeypatch)

    class Model:
        def forward(self):
            return (lambda: _outer(4, 1, monkeypatch))()

    deep = _outer(4, 1, monkeypatch, n=100)  # more frames than either walk looks at
    for python, fast in (next(gen()), Model().forward(), deep):
        assert fast is not False and fast == python
    python, fast = deep
    assert [t.split(" in ")[1] for t in python] == ["_inner", "_outer", "_outer", "_outer"]


def test_library_frames_are_skipped_alike(monkeypatch):
    """Frames of the standard library (and torch, and prism_rr) are not the user's: both
    walks pass over them to the user code that called."""
    import functools

    python, fast = functools.reduce(lambda acc, _: _outer(3, 1, monkeypatch), [0], None)
    assert fast is not False and fast == python
    assert not any("functools" in t for t in python)
