"""Step boundaries: the first stepped optimizer paces them, until the program marks one by hand."""

import torch

from prism_rr.intercept.steps import OptimizerSteps, by_hand


def test_the_first_optimizer_paces_steps_until_a_step_is_marked_by_hand():
    marks = []
    steps = OptimizerSteps(lambda: marks.append("step"))
    a = torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1)
    b = torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1)
    steps.start()
    try:
        a.step()
        b.step()  # the second optimizer of a multi-optimizer step is not news
        a.step()
        assert marks == ["step", "step"]
        by_hand()
        assert marks == ["step", "step", "step"] and steps.manual
        a.step()  # optimizer steps are no longer boundaries
        assert len(marks) == 3
    finally:
        steps.stop()
    by_hand()  # a stopped one hears nothing
    assert len(marks) == 3
