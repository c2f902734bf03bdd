import pytest

from prism_rr.errors import UsageError
from prism_rr.format import open_bundle, pack
from prism_rr.format.synthetic import write_synthetic
from prism_rr.topology.roles import Roles, derive_roles, parse_mesh, roles_for_mesh, slice_ranks
from prism_rr.recorder import RecordOptions


@pytest.mark.timeout(10)
def test_mesh_spec_and_roles_at_8192():
    roles = roles_for_mesh(8192, "dp=4096,tp=2")
    assert roles.representatives == (0, 1)
    assert roles.rep(8191) == 1 and roles.rep(8190) == 0
    assert roles.size(0) == 4096 and roles.members(1)[:3] == [1, 3, 5]
    back = Roles.from_manifest(roles.to_manifest())
    assert back.rep(4097) == 1 and back.count == 2


@pytest.mark.timeout(10)
def test_mesh_with_pipeline_keeps_stages_apart():
    roles = roles_for_mesh(16, "pp=2,dp=4,tp=2")
    assert roles.count == 4
    assert roles.rep(0) == 0 and roles.rep(9) == 9 and roles.rep(15) == 9  # pp=1, tp=1
    assert slice_ranks(16, "pp=2,dp=4,tp=2", extra=(5,)) == (0, 1, 5, 8, 9)


@pytest.mark.timeout(10)
def test_mesh_spec_errors_and_inferred_dp():
    assert parse_mesh("tp=2", 8).shape == (4, 2)
    with pytest.raises(UsageError):
        parse_mesh("dp=3,tp=2", 8)
    with pytest.raises(UsageError):
        parse_mesh("dp=two")


@pytest.mark.timeout(20)
def test_roles_from_groups_of_a_synthetic_bundle(tmp_path):
    pack(write_synthetic(tmp_path / "s", 8, 60, tp=2), tmp_path / "s.prism")
    with open_bundle(tmp_path / "s.prism") as b:
        roles = derive_roles(b)
    assert roles.by == "groups"
    assert roles.mesh.dim_names == ("dp", "tp") and roles.mesh.shape == (4, 2)
    assert roles.representatives == (0, 1)
    assert [roles.rep(r) for r in range(8)] == [0, 1] * 4


@pytest.mark.timeout(10)
def test_roles_from_recorded_device_mesh_and_explicit_mesh():
    facts = {"world_size": 4, "groups": [], "recorded_ranks": [2, 3],
             "device_mesh": {"shape": [2, 2], "dim_names": ["dp", "tp"], "ranks": [0, 1, 2, 3]}}
    roles = derive_roles(facts)
    assert roles.by == "mesh" and roles.representatives == (2, 3)  # recorded ranks stand
    assert derive_roles(facts, mesh="dp=4,tp=1").count == 1


@pytest.mark.timeout(10)
def test_record_options_slice_roles():
    opts = RecordOptions.make("/tmp/x", slice="roles", mesh="dp=2,tp=2", ranks="3")
    assert [r for r in range(4) if opts.records_rank(r, 4)] == [0, 1, 3]
    again = RecordOptions.from_json(opts.to_json())
    assert again.slice == "roles" and again.mesh == "dp=2,tp=2"
    assert RecordOptions.make("/tmp/x").records_rank(3, 4)
    later = RecordOptions.make("/tmp/x", slice="roles")  # the layout is found while recording
    assert later.slice_later and all(later.records_rank(r, 4) for r in range(4))
    assert not opts.slice_later
    with pytest.raises(UsageError):
        RecordOptions.make("/tmp/x", slice="ranks")
