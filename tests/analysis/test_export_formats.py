"""export --format chakra | parquet | chrome (gzipped, some ranks and steps).

The Chakra traces are read back by the small protobuf decoder below, written from
et_def.proto's field numbers (mlcommons/chakra), not by running the encoder backwards.
"""

import gzip
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cli_helpers import run_cli
from graph_sim import SimRun
from prism_rr.format import Collective, Compute, PointToPoint, open_bundle

FORMATS = Path(__file__).resolve().parents[2] / "docs" / "formats.md"  # the README's reference on exports


def readme_sql(naming: str) -> str:
    """The ```sql block of docs/formats.md that names `naming`: its DuckDB queries over
    `prism-rr export run.prism --format parquet -o tables`."""
    blocks = re.findall(r"```sql\n(.*?)```", FORMATS.read_text(), re.S)
    found = [b for b in blocks if naming in b]
    assert found, f"docs/formats.md has no sql block naming {naming}"
    return found[0]


# --- a protobuf wire-format reader, keyed by et_def.proto's field numbers ---------------

def _varint(buf, i):
    shift = n = 0
    while True:
        b = buf[i]
        i += 1
        n |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return n, i


def _fields(buf):
    """{field number: [values]}: ints for varints, bytes for length-delimited."""
    out, i = {}, 0
    while i < len(buf):
        key, i = _varint(buf, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            v, i = _varint(buf, i)
        elif wire == 2:
            n, i = _varint(buf, i)
            v, i = bytes(buf[i:i + n]), i + n
        else:
            raise AssertionError(f"wire type {wire} is not written by this exporter")
        out.setdefault(field, []).append(v)
    return out


def _signed(n):
    return n - (1 << 64) if n >= 1 << 63 else n


def _stream(path):
    """The varint-delimited messages of a .et file."""
    buf, i, out = path.read_bytes(), 0, []
    while i < len(buf):
        n, i = _varint(buf, i)
        out.append(buf[i:i + n])
        i += n
    return out


# AttributeProto: name = 1; oneof value: int32_val = 7, int64_val = 9, bool_val = 27, string_val = 29
_ATTR_VALUES = {7: "int32", 9: "int64", 27: "bool", 29: "string"}


def _attr(raw):
    f = _fields(raw)
    (name,) = f[1]
    (field,) = [k for k in f if k != 1]
    (value,) = f[field]
    kind = _ATTR_VALUES[field]
    value = value.decode() if kind == "string" else (bool(value) if kind == "bool" else _signed(value))
    return name.decode(), (kind, value)


def _node(raw):
    """Node: id 1, name 2, type 3, ctrl_deps 4 (packed), start_time_micros 6,
    duration_micros 7, inputs 8 (IOInfo: shapes 2, types 3), attr 10."""
    f = _fields(raw)
    deps = []
    for v in f.get(4, []):
        if isinstance(v, bytes):  # packed
            i = 0
            while i < len(v):
                d, i = _varint(v, i)
                deps.append(d)
        else:
            deps.append(v)
    io = _fields(f[8][0]) if 8 in f else {}
    return {"id": f.get(1, [0])[0], "name": f[2][0].decode(), "type": f.get(3, [0])[0], "ctrl_deps": deps,
            "start": f.get(6, [0])[0], "dur": f.get(7, [0])[0], "attrs": dict(_attr(a) for a in f.get(10, [])),
            "shapes": json.loads(io[2][0]) if 2 in io else None}


def _read_et(path):
    meta, *nodes = _stream(path)
    m = _fields(meta)
    return m[1][0].decode(), dict(_attr(a) for a in m.get(2, [])), [_node(n) for n in nodes]


# ----------------------------------------------------------------------------------------

@pytest.fixture
def sim_bundle(tmp_path):
    run = SimRun(4, groups=[(0, 1), (2, 3)])
    run.train(2)
    run.collective(0, op="broadcast", root=0, reduce_op=None)
    run.collective(1, op="reduce_scatter_tensor", shape=(8,))
    run.collective(0, op="some_future_op")  # an op Chakra has no type for
    run.end_step()
    return run.bundle(tmp_path)


def test_chakra_traces_decode_with_the_schema(sim_bundle, tmp_path):
    prefix = tmp_path / "et" / "run"
    out = run_cli("export", sim_bundle, "--format", "chakra", "-o", prefix)
    assert out.returncode == 0, out.stderr
    assert "4 calls of ops Chakra has no type for are compute nodes" in out.stderr
    groups = json.loads(Path(f"{prefix}.comm_groups.json").read_text())
    assert groups == {"0": [0, 1, 2, 3], "1": [0, 1], "2": [2, 3]}
    with open_bundle(sim_bundle) as b:
        for rank in range(4):
            version, meta, nodes = _read_et(Path(f"{prefix}.{rank}.et"))
            assert version == "0.0.4" and meta["rank"] == ("int64", rank) and meta["world_size"] == ("int64", 4)
            recs = sorted((r for r in b.events(rank) if type(r) in (Collective, PointToPoint)
                           or (type(r) is Compute and r.name is None)), key=lambda r: r.start_ns)
            assert len(nodes) == len(recs)
            for i, (node, rec) in enumerate(zip(nodes, recs)):
                assert node["id"] == i and node["ctrl_deps"] == ([i - 1] if i else [])
                assert node["dur"] == round((rec.end_ns - rec.start_ns) / 1000)
                assert node["attrs"]["is_cpu_op"] == ("bool", False)
                if type(rec) is Compute or rec.op == "some_future_op":
                    assert node["type"] == 4  # COMP_NODE
                    continue
                assert node["attrs"]["pg_name"] == ("string", str(rec.group))
                if type(rec) is Collective:
                    expect = {"all_reduce": 0, "broadcast": 5, "reduce_scatter_tensor": 7}[rec.op]
                    assert node["type"] == 7  # COMM_COLL_NODE
                    assert node["attrs"]["comm_type"] == ("int64", expect)
                    assert node["attrs"]["comm_size"] == ("int64", rec.in_bytes)
                    assert node["shapes"] == [list(s) for s in rec.in_shapes]
                else:
                    recv = rec.op == "recv"
                    assert node["type"] == (6 if recv else 5)  # COMM_RECV_NODE, COMM_SEND_NODE
                    src, dst = (rec.peer, rank) if recv else (rank, rec.peer)
                    assert node["attrs"]["comm_src"] == ("int32", src)
                    assert node["attrs"]["comm_dst"] == ("int32", dst)
                    assert node["attrs"]["comm_tag"] == ("int32", rec.tag)
                    assert node["attrs"]["comm_size"] == ("int64", rec.nbytes)
            starts = [n["start"] for n in nodes]
            assert starts == sorted(starts)
    kinds = [n["type"] for n in _read_et(Path(f"{prefix}.0.et"))[2]]
    assert kinds.count(5) == 2 and 6 not in kinds  # rank 0 sends, rank 1 receives


def test_parquet_tables_and_the_readme_query(sim_bundle, tmp_path):
    duckdb = pytest.importorskip("duckdb")
    out = run_cli("export", sim_bundle, "--format", "parquet", "-o", tmp_path / "tables")
    assert out.returncode == 0, out.stderr
    with open_bundle(sim_bundle) as b:
        n_calls = sum(type(r) in (Collective, PointToPoint) for rank in range(4) for r in b.events(rank))
    db = duckdb.connect()
    q = lambda sql: db.execute(sql.replace("tables/", f"{tmp_path}/tables/")).fetchall()  # noqa: E731
    assert q("SELECT count(*) FROM 'tables/calls/*.parquet'") == [(n_calls,)]
    assert q("SELECT count(*) FROM 'tables/steps.parquet'") == [(12,)]
    assert q("SELECT \"group\", size, ranks FROM 'tables/groups.parquet' ORDER BY 1") == [
        (0, 4, [0, 1, 2, 3]), (1, 2, [0, 1]), (2, 2, [2, 3])]
    # the members of one collective: one row per rank, same group and seq
    assert q("SELECT count(DISTINCT rank) FROM 'tables/calls/*.parquet' "
             "WHERE kind = 'collective' AND \"group\" = 0 AND seq = 0") == [(4,)]
    assert q("SELECT peer FROM 'tables/calls/*.parquet' WHERE op = 'send' LIMIT 1") == [(1,)]
    assert q("SELECT min(start_ns) >= 0 FROM 'tables/calls/*.parquet'") == [(True,)]
    rows = q(readme_sql("ms_in_calls"))
    assert rows and {r[0] for r in rows} >= {"all_reduce", "send", "recv", "broadcast"}
    assert sum(r[1] for r in rows) == n_calls


def test_parquet_files_partition_the_ranks(tmp_path, monkeypatch):
    """A file per RANKS_A_FILE ranks (1,024; 4 here, on 10 ranks) of each large table, each
    rank's rows in time order: the footers' statistics let an engine skip the files and row
    groups a filter on rank or step cannot match."""
    pq = pytest.importorskip("pyarrow.parquet")
    duckdb = pytest.importorskip("duckdb")
    from prism_rr.analysis import _parquet, export_parquet
    from prism_rr.format import pack
    from prism_rr.format.synthetic import write_synthetic

    monkeypatch.setattr(_parquet, "RANKS_A_FILE", 4)
    bundle = tmp_path / "wide.prism"
    pack(write_synthetic(tmp_path / "spools", 10, 200), bundle)
    with open_bundle(bundle) as b:
        export_parquet(b, tmp_path / "tables")
        n = sum(type(r) in (Collective, PointToPoint) for rank in (1, 9) for r in b.events(rank))
    for table in ("calls", "compute"):
        files = sorted((tmp_path / "tables" / table).iterdir())
        assert [f.name for f in files] == ["ranks-0-3.parquet", "ranks-4-7.parquet", "ranks-8-9.parquet"]
        for f, (lo, hi) in zip(files, ((0, 3), (4, 7), (8, 9))):
            meta = pq.ParquetFile(f).metadata
            stats = [meta.row_group(i).column(0).statistics for i in range(meta.num_row_groups)]
            assert meta.schema.column(0).name == "rank" and all(lo <= s.min <= s.max <= hi for s in stats)
        rows = pq.read_table(files[0]).to_pylist()
        for rank in range(4):  # each rank's rows in time order, so by step
            mine = [(r["start_ns"], r["step"]) for r in rows if r["rank"] == rank]
            assert mine and mine == sorted(mine)
    got = duckdb.connect().execute(f"SELECT count(*) FROM '{tmp_path}/tables/calls/*.parquet' "
                                   "WHERE rank IN (1, 9)").fetchall()
    assert got == [(n,)]
    # exported again with fewer ranks, the directory holds only the new files
    with open_bundle(bundle) as b:
        export_parquet(b, tmp_path / "tables", ranks=[0, 1])
    assert [f.name for f in (tmp_path / "tables" / "calls").iterdir()] == ["ranks-0-1.parquet"]


def test_parquet_without_pyarrow_says_how_to_install(sim_bundle, tmp_path):
    code = ("import sys; sys.modules['pyarrow'] = None; sys.argv = ['prism-rr', *sys.argv[1:]]; "
            "from prism_rr.cli import main; main()")
    out = subprocess.run([sys.executable, "-c", code, "export", str(sim_bundle), "--format", "parquet",
                          "-o", str(tmp_path / "t")], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "pip install 'prism-rr[parquet]'" in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_chrome_gzip_ranks_and_steps(sim_bundle, tmp_path):
    out = run_cli("export", sim_bundle, "-o", tmp_path / "t.json.gz", "--ranks", "1-2", "--steps", "1:2")
    assert out.returncode == 0, out.stderr
    doc = json.loads(gzip.decompress((tmp_path / "t.json.gz").read_bytes()))
    events = doc["traceEvents"]
    assert {e["pid"] for e in events} == {1, 2}
    assert {e["args"]["step"] for e in events if e["ph"] == "X"} == {1}
    flag = run_cli("export", sim_bundle, "-o", tmp_path / "t.trace", "--gzip")
    assert flag.returncode == 0 and gzip.decompress((tmp_path / "t.trace").read_bytes()).startswith(b"{")
    assert run_cli("export", sim_bundle, "--format", "svg", "-o", tmp_path / "x").returncode == 2


@pytest.mark.timeout(360)
def test_exports_of_the_demo(make_demo, tmp_path):
    """The 4-rank demo (FSDP2 x TP on gloo): every call is a Chakra node and a Parquet row."""
    duckdb = pytest.importorskip("duckdb")
    assert make_demo.result().returncode == 0, make_demo.result().stderr
    bundle = make_demo.bundle
    with open_bundle(bundle) as b:
        calls = {r: sum(type(e) in (Collective, PointToPoint) for e in b.events(r)) for r in b.recorded_ranks}
        groups = {str(g["id"]): list(g["ranks"]) for g in b.groups}
    for fmt, out in (("chakra", tmp_path / "et" / "demo"), ("parquet", tmp_path / "tables"),
                     ("chrome", tmp_path / "demo.json.gz")):
        res = run_cli("export", bundle, "--format", fmt, "-o", out)
        assert res.returncode == 0, res.stderr
    assert json.loads((tmp_path / "et" / "demo.comm_groups.json").read_text()) == groups
    for r, n in calls.items():
        nodes = _read_et(tmp_path / "et" / f"demo.{r}.et")[2]
        assert sum(node["type"] in (5, 6, 7) for node in nodes) == n
        assert all(node["attrs"]["pg_name"][1] in groups for node in nodes if node["type"] == 7)
    db = duckdb.connect()
    rows = db.execute(
        f"SELECT rank, count(*) FROM '{tmp_path}/tables/calls/*.parquet' GROUP BY rank ORDER BY rank").fetchall()
    assert dict(rows) == calls
    # The README's straggler query gives analyze's lateness: who held the others up, by how
    # much, into how many calls, per step
    late = db.execute(readme_sql("late_calls").replace("tables/", f"{tmp_path}/tables/")).fetchall()
    analysed = json.loads(run_cli("analyze", bundle, "--json").stdout)
    want = {(s["step"], int(r)): (v["late_ns"], v["late_calls"])
            for s in analysed["steps"] for r, v in s["ranks"].items() if v["late_calls"]}
    assert want and {(step, rank): (ns, n) for step, rank, ns, n in late} == want
    doc = json.loads(gzip.decompress((tmp_path / "demo.json.gz").read_bytes()))
    assert {e["pid"] for e in doc["traceEvents"]} == set(calls)


def test_exports_and_diff_of_imported_flight_recorder_dumps(tmp_path):
    """Real gloo Flight Recorder dumps (tests/data/fr), imported: no compute records, no
    steps. Chakra gets a compute node for each gap between calls; diff exits 6 for the
    run where a rank skipped a collective."""
    duckdb = pytest.importorskip("duckdb")
    from prism_rr.format.fr import import_fr

    fr = Path(__file__).resolve().parents[1] / "data" / "fr"
    for name in ("normal", "skip", "groups"):
        import_fr([fr / name / "pickle"], tmp_path / f"{name}.prism")
    out = run_cli("export", tmp_path / "groups.prism", "--format", "chakra", "-o", tmp_path / "et" / "g")
    assert out.returncode == 0, out.stderr
    with open_bundle(tmp_path / "groups.prism") as b:
        groups = {str(g["id"]): list(g["ranks"]) for g in b.groups}
        total = 0
        for r in b.recorded_ranks:
            calls = [e for e in b.events(r) if type(e) is Collective]
            total += len(calls)
            nodes = _read_et(tmp_path / "et" / f"g.{r}.et")[2]
            comm = [n for n in nodes if n["type"] == 7]
            assert len(comm) == len(calls) and {n["attrs"]["pg_name"][1] for n in comm} <= set(groups)
            assert all(n["type"] in (4, 7) for n in nodes)
    assert json.loads((tmp_path / "et" / "g.comm_groups.json").read_text()) == groups
    assert run_cli("export", tmp_path / "groups.prism", "--format", "parquet", "-o", tmp_path / "t").returncode == 0
    rows = duckdb.connect().execute(f"SELECT count(*), count(DISTINCT \"group\") FROM '{tmp_path}/t/calls/*.parquet'").fetchall()
    assert rows == [(total, len(groups))]  # the world, two rows and two columns of a 2x2 mesh
    same = run_cli("diff", tmp_path / "normal.prism", tmp_path / "normal.prism")
    assert same.returncode == 0 and "time: not compared" in same.stdout
    differ = run_cli("diff", tmp_path / "normal.prism", tmp_path / "skip.prism", "--json")
    assert differ.returncode == 6
    assert json.loads(differ.stdout)["first_difference"]["a"]["stack"]
