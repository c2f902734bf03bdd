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


def test_a_small_tensors_bytes_and_whether_its_storage_holds_it():
    """The bytes a `digest` recording keeps of a small tensor (read straight from its
    storage where it can be) are those torch gives, whatever the view; a storage freed
    or shrunk under the tensor (FSDP2's resize_(0)) is seen as such, not read."""
    from prism_rr.intercept.payload import _small_bytes, alive, host_bytes

    base = torch.arange(12, dtype=torch.float32)
    views = [base, base[3:7], base[::2], base.view(3, 4)[1:, 1:], base.view(3, 4).t(), torch.tensor(2.5),
             torch.arange(6, dtype=torch.bfloat16)[2:], torch.tensor([True, False, True]),
             torch.zeros(0), torch.ones(1).expand(5)]
    for t in views:
        assert _small_bytes(t) == bytes(host_bytes(t))
        assert alive([t])
    assert _small_bytes(base[3:7]) == torch.tensor([3.0, 4.0, 5.0, 6.0]).numpy().tobytes()
    assert _small_bytes(base.view(3, 4)[1:, 1:]) == torch.tensor([5.0, 6, 7, 9, 10, 11]).numpy().tobytes()
    assert _small_bytes(torch.arange(6, dtype=torch.bfloat16)[2:]) == torch.arange(2, 6).to(torch.bfloat16).view(
        torch.int16).numpy().tobytes()
    freed = torch.arange(8, dtype=torch.float32)
    view = freed[4:]
    freed.untyped_storage().resize_(0)
    assert not alive([view]) and not alive([freed]) and not alive([torch.ones(2), view])
    shrunk = torch.arange(8, dtype=torch.float32)
    tail = shrunk[6:]
    shrunk.untyped_storage().resize_(6 * 4)  # holds the first six elements only
    assert not alive([tail]) and alive([shrunk[:6]])
