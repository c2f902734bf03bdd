"""What a record says of a call's tensors: shapes, dtypes and bytes, whatever the tensor."""

import torch

from prism_rr.intercept.payload import describe


def test_one_tensor_or_several_and_sparse_ones():
    """A sparse tensor (gloo all-reduces them: DDP with a sparse embedding) has no nbytes
    in torch; its description counts its elements as a dense one would."""
    dense = torch.zeros(4, 3)
    sparse = dense.to_sparse()
    assert describe([dense]) == (((4, 3),), ("float32",), 48)
    assert describe([sparse]) == (((4, 3),), ("float32",), 48)
    assert describe([sparse, torch.ones(2, dtype=torch.int8)]) == (((4, 3), (2,)), ("float32", "int8"), 50)
    assert describe([dense[:, ::2]]) == (((4, 2),), ("float32",), 32)
    assert describe([]) == ((), (), 0)


def test_one_description_for_every_tensor_of_a_shape_and_dtype():
    # shared, not made anew: records waiting in a spool hold one object, not one each
    assert describe([torch.zeros(5, 7)]) is describe([torch.ones(5, 7)])
    assert describe([torch.zeros(5, 7)]) != describe([torch.zeros(5, 7, dtype=torch.float64)])
