"""`snapdiff.fleet` on a generated job of 64 ranks replayed from a real
PyTorch trace (`bench/make_fleet.rs`): locally, on a real local Ray
cluster, and the site tables read back with DuckDB, running the queries
the user guide shows."""

import html
import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import snapdiff

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT.parent / "shared" / "fixtures" / "torch" / "cs336-medium-128-inference.pickle"
RANKS, STEPS = 64, 6


def need(module, why):
    """Imports `module`; skips without it, or fails where CI requires it."""
    if os.environ.get("SNAPDIFF_REQUIRE_RAY"):
        return importlib.import_module(module)
    return pytest.importorskip(module, reason=why)


@pytest.fixture(scope="session")
def job(tmp_path_factory):
    """The job's folder and what a right verdict says (make_fleet's JSON)."""
    if not SOURCE.exists():
        if os.environ.get("SNAPDIFF_REQUIRE_SHARED"):
            pytest.fail(f"{SOURCE} is missing")
        pytest.skip("../shared/fixtures/torch is not here")
    folder = tmp_path_factory.mktemp("job")
    made = subprocess.run(
        ["cargo", "run", "--quiet", "--example", "make_fleet", "--",
         str(SOURCE), str(RANKS), str(STEPS), str(folder)],
        cwd=ROOT, capture_output=True, text=True, check=True,
    )
    return folder, json.loads(made.stdout)


@pytest.fixture(scope="session")
def cluster():
    """A real Ray cluster on this machine, two CPUs."""
    ray = need("ray", "pip install 'torch-snapdiff[ray]'")
    need("pyarrow", "pip install 'torch-snapdiff[ray]'")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def same_line(culprit, truth):
    return (culprit.name, culprit.file, culprit.line) == (
        truth["name"], truth["file"], truth["line"])


def test_the_verdict_names_every_leaking_rank_and_line_and_rank0s_imbalance(job):
    folder, truth = job
    result = snapdiff.fleet(folder)
    assert (result.processes, result.files) == (RANKS, truth["files"])
    leaking = sum(len(leak["ranks"]) for leak in truth["leaks"])
    assert (result.leaking, result.steady) == (leaking, RANKS - leaking)
    assert len(result.leaks) == len(truth["leaks"])
    for expected in truth["leaks"]:
        [found] = [l for l in result.leaks if same_line(l.site.culprit, expected["culprit"])]
        assert found.ranks == [r for r, _ in expected["ranks"]]
        assert found.growth_per_step == [float(b) for _, b in expected["ranks"]]
    [held] = result.imbalance
    assert same_line(held.site.culprit, truth["held_by_rank0"])
    assert held.ranks == [0] and held.excess_bytes == [truth["held_bytes"]]
    assert [r.rank for r in result.ranks] == list(range(RANKS))
    # For people: one short line, and the verdict humanised in a notebook.
    counts = f"{RANKS} ranks: {RANKS - leaking} steady, {leaking} leaking"
    assert repr(result) == f"<Fleet {counts}>"
    assert str(result).splitlines()[0] == counts
    page = result._repr_html_()
    for leak in result.leaks:
        assert leak.culprit is leak.site.culprit
        assert html.escape(leak.rate()) in page and " a step" in leak.rate()
    assert "[" not in page.split("<table>", 1)[1], "no Python lists in the table"


def test_ray_gives_the_same_verdict_rank_by_rank_and_site_by_site(job, cluster):
    folder, _ = job
    here = snapdiff.fleet(folder)
    on_ray = snapdiff.fleet(folder, engine="ray")
    assert on_ray.failed == []
    assert on_ray.ranks == here.ranks
    assert on_ray.leaks == here.leaks
    assert on_ray.imbalance == here.imbalance
    assert (on_ray.files, on_ray.bytes, on_ray.unreadable) == (here.files, here.bytes, here.unreadable)


def without_sources(ranks):
    """Rank verdicts without their files' paths (copied elsewhere)."""
    for r in ranks:
        r.checkpoints = [{k: v for k, v in c.items() if k != "source"} for c in r.checkpoints]
    return ranks


def test_ray_reads_files_where_they_are_and_from_uris(job, cluster):
    folder, _ = job
    here = snapdiff.fleet(folder)
    node = cluster.get_runtime_context().get_node_id()
    ip = cluster.util.get_node_ip_address()
    # Files on a node's own disk, read there (by node id, and by address).
    per_node = snapdiff.fleet(
        {node: [folder / f"node{n}" for n in range(4)],
         ip: [folder / f"node{n}" for n in range(4, 8)]},
        engine="ray",
    )
    assert per_node.ranks == here.ranks and per_node.leaks == here.leaks
    # A URI pyarrow.fs opens: the tasks copy the files, then read them.
    from_uri = snapdiff.fleet(f"file://{folder}", engine="ray")
    assert without_sources(from_uri.ranks) == without_sources(here.ranks)
    assert from_uri.imbalance == here.imbalance


def test_ray_on_three_nodes_reads_each_nodes_files_there_and_names_a_lost_node(job):
    """A real cluster of three Ray nodes on this machine (in a process of
    its own, see ray_nodes.py): each node reads the folders placed on it,
    the verdict is `fleet`'s on all the files, and a node removed while the
    fleet waits on it is named in `failed` while the rest is judged."""
    need("ray", "pip install 'torch-snapdiff[ray]'")
    need("pyarrow", "pip install 'torch-snapdiff[ray]'")
    folder, truth = job
    ran = subprocess.run(
        [sys.executable, Path(__file__).with_name("ray_nodes.py"), folder],
        capture_output=True, text=True, timeout=900,
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    report = json.loads(ran.stdout.strip().splitlines()[-1])
    assert report["nodes"] == 3
    # Each node read exactly the files placed on it.
    assert report["read_on"] == report["placed"], report
    assert report["processes"] == RANKS and report["files"] == truth["files"]
    assert report["failed"] == []
    here = snapdiff.fleet(folder)
    assert report["leaks"] == [[l.ranks, l.culprit.file, l.culprit.line] for l in here.leaks]

    after = report["after_removal"]
    lost = [f for task in after["failed"] for f in task["files"]]
    held = sorted(str(p) for p in sorted(folder.iterdir())[2::3])
    assert lost == held, after["failed"]
    assert after["lost"] not in after["read_on"], after
    # The two nodes left judged their ranks: six of the eight node folders.
    assert after["processes"] == RANKS * 6 // 8, after


@pytest.fixture
def s3_server():
    """A real server of the S3 protocol on this machine (moto's server
    mode, its own HTTP server on a free port): (host:port, a boto3 client)."""
    moto_server = need("moto.server", "pip install 'moto[server]'")
    boto3 = need("boto3", "pip install 'moto[server]'")
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    client = boto3.client(
        "s3", endpoint_url=f"http://{host}:{port}", region_name="us-east-1",
        aws_access_key_id="test", aws_secret_access_key="test",
    )
    yield f"{host}:{port}", client
    server.stop()


def test_ray_reads_a_job_from_object_storage_with_the_verdict_of_its_local_files(
    job, cluster, s3_server
):
    """The job uploaded to an S3-protocol server and judged from there by
    Ray tasks (`pyarrow.fs`, the endpoint in the URI's query kept for
    every file): the same verdict as from the local files."""
    folder, truth = job
    endpoint, client = s3_server
    client.create_bucket(Bucket="runs")
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            key = f"job/{path.relative_to(folder).as_posix()}"
            # Readable without credentials: the Ray workers have none.
            client.put_object(Bucket="runs", Key=key, Body=path.read_bytes(), ACL="public-read")
    remote = snapdiff.fleet(f"s3://runs/job?endpoint_override={endpoint}&scheme=http",
                            engine="ray")
    here = snapdiff.fleet(folder)
    assert remote.failed == [] and remote.unreadable == []
    assert (remote.processes, remote.files) == (RANKS, truth["files"])
    assert [(l.ranks, l.culprit) for l in remote.leaks] == [
        (l.ranks, l.culprit) for l in here.leaks]
    assert [(i.ranks, i.site.culprit) for i in remote.imbalance] == [
        (i.ranks, i.site.culprit) for i in here.imbalance]


def test_ray_names_unreadable_files_and_failed_tasks_and_judges_the_rest(job, cluster, tmp_path):
    folder, _ = job
    for rank in range(8):
        for step in range(STEPS):
            name = f"rank{rank}-step{step}.snap"
            (tmp_path / name).write_bytes((folder / "node0" / name).read_bytes())
    (tmp_path / "rank3-step5.snap").write_bytes(b"\x00" * 100)
    node = cluster.get_runtime_context().get_node_id()
    ip = cluster.util.get_node_ip_address()
    result = snapdiff.fleet({node: [tmp_path], ip: ["/nonexistent/dumps"]}, engine="ray")
    assert result.processes == 8 and result.files == 8 * STEPS - 1
    assert [u["source"] for u in result.unreadable] == [str(tmp_path / "rank3-step5.snap")]
    assert len(result.failed) == 1
    assert result.failed[0]["files"] == ["/nonexistent/dumps"]
    assert "no such file or folder" in result.failed[0]["error"]
    assert [l.ranks for l in result.leaks] == [[7]]
    # What could not be judged is said wherever the verdict is shown.
    said = "8 ranks: 7 steady, 1 leaking, 1 unreadable, 1 in failed Ray tasks"
    assert repr(result) == f"<Fleet {said}>"
    assert said in result._repr_html_() and "/nonexistent/dumps" in result._repr_html_()


@pytest.mark.parametrize("codec", ["snappy", "gzip", "lz4", "brotli", "zstd", "none"])
def test_tables_resaved_with_any_codec_give_the_same_verdict(job, tmp_path, codec):
    """Tables re-saved by pandas, DuckDB, Spark or pyarrow (Snappy is their
    default) read as the ones `export` wrote."""
    pq = need("pyarrow.parquet", "pip install pyarrow")
    folder, _ = job
    tables = tmp_path / "tables"
    subprocess.run([snapdiff._cli.binary(), "export", str(folder), "-o", str(tables)], check=True)
    resaved = tmp_path / codec
    resaved.mkdir()
    for table in tables.iterdir():
        pq.write_table(pq.read_table(table), resaved / table.name, compression=codec)
    expected = snapdiff._cli.run_json("fleet", [tables])
    got = snapdiff._cli.run_json("fleet", [resaved])
    for key in ("processes", "leaking", "steady", "leaks", "imbalance"):
        assert got[key] == expected[key], key
    assert got["unreadable"] == []


def test_tables_written_before_the_measured_columns_still_read(job, tmp_path):
    """`checkpoints.parquet` of an older snapdiff has no `rss_bytes`,
    `device_used_bytes` or `recorded_on_cpu`: it reads, with nothing said
    of memory outside the sites."""
    pq = need("pyarrow.parquet", "pip install pyarrow")
    folder, _ = job
    tables = tmp_path / "tables"
    subprocess.run([snapdiff._cli.binary(), "export", str(folder), "-o", str(tables)], check=True)
    older = tmp_path / "older"
    older.mkdir()
    for table in tables.iterdir():
        t = pq.read_table(table)
        if table.name == "checkpoints.parquet":
            assert {"rss_bytes", "device_used_bytes", "recorded_on_cpu"} <= set(t.column_names)
            t = t.drop_columns(["rss_bytes", "device_used_bytes", "recorded_on_cpu"])
        pq.write_table(t, older / table.name)
    expected = snapdiff._cli.run_json("fleet", [tables])
    got = snapdiff._cli.run_json("fleet", [older])
    for key in ("processes", "leaking", "steady", "leaks", "imbalance"):
        assert got[key] == expected[key], key
    assert all("outside" not in m for m in got["members"])


def test_a_process_name_in_a_table_cannot_forge_verdict_lines(job, tmp_path):
    """A table is another tool's output: a process name holding a newline
    and a terminal escape is printed escaped, never as lines of its own."""
    pa = need("pyarrow", "pip install pyarrow")
    pq = need("pyarrow.parquet", "pip install pyarrow")
    folder, truth = job
    tables = tmp_path / "tables"
    subprocess.run([snapdiff._cli.binary(), "export", str(folder), "-o", str(tables)], check=True)
    leaking = f"rank{truth['leaks'][0]['ranks'][0][0]}"
    forged = "worker\n64 ranks read: 64 steady, 0 leaking\x1b[2J"
    for table in tables.iterdir():
        t = pq.read_table(table)
        if "process" in t.column_names:
            names = [forged if n == leaking else n for n in t.column("process").to_pylist()]
            t = t.set_column(t.column_names.index("process"), "process", pa.array(names))
        pq.write_table(t, table)
    code, out, _ = snapdiff._cli.run(["fleet", tables])
    assert code == 0
    assert "worker\\x0a64 ranks read" in out, out
    assert "\x1b" not in out
    assert not any(line.startswith("64 ranks read: 64 steady") for line in out.splitlines())


def test_sums_over_ranks_never_wrap(job, tmp_path):
    """Tables from another tool can hold any number: a line's growth over
    two ranks of 2**63 bytes each is at most the largest number, never 0
    (release builds wrapped it)."""
    pa = need("pyarrow", "pip install pyarrow")
    pq = need("pyarrow.parquet", "pip install pyarrow")
    folder, _ = job
    tables = tmp_path / "tables"
    subprocess.run([snapdiff._cli.binary(), "export", str(folder), "-o", str(tables)], check=True)
    report = snapdiff._cli.run_json("fleet", [tables])
    [leak] = [l for l in report["leaks"] if len(l["members"]) == 2]
    ranks = {m["rank"] for m in leak["members"]}
    sites = pq.read_table(tables / "sites.parquet")
    huge = [
        c * 2**61 if rank in ranks and key == leak["site"]["key"] else b
        for rank, key, c, b in zip(
            sites.column("rank").to_pylist(), sites.column("stack_key").to_pylist(),
            sites.column("checkpoint").to_pylist(), sites.column("requested_bytes").to_pylist())
    ]
    at = sites.column_names.index("requested_bytes")
    sites = sites.set_column(at, "requested_bytes", pa.array(huge, pa.uint64()))
    pq.write_table(sites, tables / "sites.parquet")
    forged = snapdiff._cli.run_json("fleet", [tables])
    [grown] = [l for l in forged["leaks"] if l["site"]["key"] == leak["site"]["key"]]
    assert [m["growth_bytes"] for m in grown["members"]] == [2**63, 2**63]
    assert grown["growth_bytes"] == 2**64 - 1


def test_thirty_thousand_paths_reach_the_command_and_each_file_counts_once(job):
    """More paths than a command line holds go through `--paths-from`;
    30,000 spellings of the job's files (`dir/./f`, `dir/././f`, ...) are
    read as its files, once each."""
    folder, truth = job
    files = sorted(p for p in folder.rglob("*.snap"))
    assert len(files) == truth["files"]
    paths = []
    hops = 0
    while len(paths) < 30_000:
        hops += 1
        paths += [os.path.join(f.parent, *["."] * hops, f.name) for f in files]
    result = snapdiff.fleet(paths[:30_000])
    expected = snapdiff.fleet(folder)
    assert result.files == truth["files"]
    assert (result.processes, result.leaking) == (expected.processes, expected.leaking)
    assert [l.ranks for l in result.leaks] == [l.ranks for l in expected.leaks]


def test_python_lists_snapshots_by_the_commands_rule():
    """Ray tasks are handed the files Python lists: the extensions it takes
    are those of `snapdiff_format::names`."""
    from snapdiff import _ray

    names_rs = (ROOT / "crates" / "format" / "src" / "names.rs").read_text()
    listed = re.search(r"SNAPSHOT_EXTENSIONS: \[&str; \d+\] = \[(.*?)\];", names_rs, re.S).group(1)
    rust = sorted(re.findall(r'"(\w+)"', listed))
    python = sorted(re.search(r"\\\.\((.*?)\)\$", _ray._SNAPSHOT.pattern).group(1).split("|"))
    assert python == rust


def guide_queries():
    """The SQL blocks of the user guide, by the name on their first line."""
    text = (ROOT / "docs" / "user-guide.md").read_text()
    blocks = re.findall(r"```sql\n(.*?)```", text, re.S)
    return {re.match(r"-- query: (.*)", b).group(1): b for b in blocks}


def test_the_guides_duckdb_queries_answer_as_the_json_does(job, tmp_path, monkeypatch):
    duckdb = need("duckdb", "pip install duckdb")
    folder, _ = job
    tables = tmp_path / "tables"
    subprocess.run([snapdiff._cli.binary(), "export", str(folder), "-o", str(tables)], check=True)
    report = snapdiff._cli.run_json("fleet", [tables])
    queries = guide_queries()
    assert sorted(queries) == ["memory per rank per step", "ranks at one line", "top growth"]
    monkeypatch.chdir(tables)
    db = duckdb.connect()

    top = db.sql(queries["top growth"]).fetchall()
    expected = sorted(
        ((l["site"]["culprit"]["name"], l["site"]["culprit"]["file"], l["site"]["culprit"]["line"],
          len(l["members"]), l["growth_bytes"]) for l in report["leaks"]),
        key=lambda row: -row[4],
    )
    assert top == expected

    [held] = report["imbalance"]
    assert held["site"]["culprit"]["line"] == 430
    rows = db.sql(queries["ranks at one line"]).fetchall()
    assert rows[0] == (0, held["median_bytes"] + held["members"][0]["excess_bytes"])

    per_step = db.sql(queries["memory per rank per step"]).fetchall()
    assert per_step == [
        (m["rank"], m["device"], c["step"], c["allocated_bytes"], c["reserved_bytes"])
        for m in report["members"] for c in m["checkpoints"]
    ]


LEAKING_JOB = """
import torch

model = torch.nn.Linear(64, 64)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
history = []
kept = {}
for step in range(8):
    out = model(torch.randn(16, 64))
    out.square().mean().backward()
    optimizer.step()
    optimizer.zero_grad()
    history.append(out.detach() * 1)  # LEAK
    kept[step] = out.detach() * 2  # LEAK
"""


@pytest.fixture(scope="module")
def owned(tmp_path_factory):
    """A real job captured with `--owners`: two leaking lines, each held by
    its own container."""
    folder = tmp_path_factory.mktemp("owned")
    script = folder / "train.py"
    script.write_text(LEAKING_JOB)
    subprocess.run(
        [snapdiff._cli.binary(), "capture", "--owners", "--no-report", "-o", folder / "dumps",
         "--every", "1", "--", "python3", script],
        check=True, capture_output=True,
    )
    return folder


def held_by(report):
    return sorted(
        (leak["site"]["culprit"]["line"], h["owner"], h["blocks"], h["bytes"])
        for leak in report["leaks"]
        for h in leak.get("held_by", [])
    )


def test_fleet_from_tables_and_on_ray_says_held_by_as_from_snapshots(owned, cluster, tmp_path):
    binary = snapdiff._cli.binary()
    fleet = lambda path: json.loads(subprocess.run(
        [binary, "fleet", path, "--json"], check=True, capture_output=True, text=True).stdout)
    from_snapshots = fleet(owned / "dumps")
    expected = held_by(from_snapshots)
    assert [(line, owner) for line, owner, _, _ in expected] == [
        (13, "train.history"), (14, "train.kept")], expected
    tables = tmp_path / "tables"
    subprocess.run([binary, "export", owned / "dumps", "-o", tables], check=True, capture_output=True)
    assert (tables / "owners.parquet").is_file()
    assert held_by(fleet(tables)) == expected
    on_ray = snapdiff.fleet(owned / "dumps", engine="ray")
    assert on_ray.failed == []
    assert on_ray.leaks == snapdiff.fleet(owned / "dumps").leaks
    assert sorted(
        (leak.site.culprit.line, h["owner"])
        for leak in on_ray.leaks for h in leak.held_by
    ) == [(13, "train.history"), (14, "train.kept")]


def test_the_guides_top_growth_query_leaves_exit_dumps_out_as_the_verdict_does(
        owned, tmp_path, monkeypatch):
    """A real captured job's tables hold its `-exit` dump, taken after the
    program freed its variables: the guide's query answers as the verdict
    does (it named no line while the exit dump was its last checkpoint)."""
    duckdb = need("duckdb", "pip install duckdb")
    assert list((owned / "dumps").glob("*-exit.pickle"))
    tables = tmp_path / "tables"
    subprocess.run([snapdiff._cli.binary(), "export", owned / "dumps", "-o", tables], check=True)
    report = snapdiff._cli.run_json("fleet", [tables])
    monkeypatch.chdir(tables)
    top = duckdb.connect().sql(guide_queries()["top growth"]).fetchall()
    # The query compares two checkpoints (the verdict judges the series):
    # each leaking line is there with the verdict's growth.
    leaks = {(l["site"]["culprit"]["line"], l["growth_bytes"]) for l in report["leaks"]}
    assert {line for line, _ in leaks} == {13, 14}, report["leaks"]
    assert leaks <= {(row[2], row[4]) for row in top}, top


def test_memory_growing_outside_the_recorded_sites_is_in_the_fleets_result(tmp_path):
    """A real CPU job keeping a 16 MiB numpy array a step: no recorded site
    grows, the process does; the result says so in `outside`, its counts,
    its text and its notebook view."""
    need("torch", "pip install torch")
    subprocess.run(
        [snapdiff._cli.binary(), "capture", "--no-report", "-o", tmp_path / "dumps",
         "--every", "1", "--", "python3", ROOT / "tests/support/torch_train.py",
         "--steps", "12", "--leak", "numpy-list", "--device", "cpu"],
        check=True, capture_output=True,
    )
    result = snapdiff.fleet(tmp_path / "dumps")
    assert result.leaking == 0
    assert len(result.outside) == 1, result.outside
    growth = result.outside[0]
    assert growth.what == "process"
    # 16 MiB a step, give or take what the allocator and Python add.
    assert 15 << 20 <= growth.growth_per_step <= 18 << 20, growth
    assert "1 with memory growing outside the recorded sites" in result.counts()
    assert "outside the recorded sites on" in str(result)
    assert "the process&#x27;s resident memory" in result._repr_html_()

    steady = tmp_path / "steady"
    subprocess.run(
        [snapdiff._cli.binary(), "capture", "--no-report", "-o", steady, "--every", "1", "--",
         "python3", ROOT / "tests/support/torch_train.py", "--steps", "12", "--device", "cpu"],
        check=True, capture_output=True,
    )
    assert snapdiff.fleet(steady).outside == []


def test_object_keys_with_dots_make_folders_only_inside_the_tasks_own():
    """An object store's key may hold `..`: the Ray task copied
    `runs/../../../../tmp/x/rank0.pickle` to a folder outside its
    temporary one. Every key's folder now lies inside it, and two keys'
    folders stay apart."""
    from snapdiff._ray import _local_folder

    under = "/work/in"
    remotes = [
        "runs/job", "/runs/job", "runs//job", "runs/./job", "runs/../job",
        "../../../../tmp/x", "..", "/..", "runs/%2/job", "runs/%25/job",
    ]
    folders = [_local_folder(under, r) for r in remotes]
    for remote, folder in zip(remotes, folders):
        assert os.path.normpath(folder).startswith(under + "/"), (remote, folder)
        assert ".." not in folder.split("/"), (remote, folder)
    assert len(set(folders)) == len(remotes), folders
