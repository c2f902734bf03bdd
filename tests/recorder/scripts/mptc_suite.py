"""A small distributed test suite in PyTorch's own harness, MultiProcessTestCase: each test
spawns fresh processes for its ranks (world 2, gloo, a FileStore of its own), so under
`record` each test is an attempt of its own. Run as `python mptc_suite.py`."""

import torch
import torch.distributed as dist
from torch.testing._internal.common_distributed import MultiProcessTestCase
from torch.testing._internal.common_utils import run_tests


class Collectives(MultiProcessTestCase):
    @property
    def world_size(self) -> int:
        return 2

    def setUp(self) -> None:
        super().setUp()
        self._spawn_processes()

    def _init(self) -> None:
        store = dist.FileStore(self.file_name, self.world_size)
        dist.init_process_group("gloo", store=store, rank=self.rank, world_size=self.world_size)

    def test_all_reduce(self) -> None:
        self._init()
        t = torch.ones(3) * (self.rank + 1)
        dist.all_reduce(t)
        dist.all_reduce(t)
        self.assertEqual(t.tolist(), [6.0, 6.0, 6.0])
        dist.destroy_process_group()

    def test_send_recv(self) -> None:
        self._init()
        t = torch.arange(4.0)
        if self.rank == 0:
            dist.send(t, 1)
        else:
            got = torch.zeros(4)
            dist.recv(got, 0)
            self.assertEqual(got.tolist(), t.tolist())
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    run_tests()
