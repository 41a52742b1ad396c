"""`snapdiff.fleet(..., engine="ray")`: a job's files read where they
are, by Ray tasks that each run `snapdiff export` on a batch of ranks and
return its site tables; the tables are brought together and judged by
`snapdiff fleet` here. Imported only when Ray is asked for."""

import json
import os
import re
import shutil
import tempfile

from snapdiff._cli import run_with_paths
from snapdiff._fleet import TASK_RETRIES, _TABLES, _fleet_json, _fleet_of

# The rules of `snapdiff_format::names` (docs/format.md, "File names"):
# the snapshots' extensions, and the process a file's name says wrote it
# (`rank3-step40.pickle`, `pid812-step40.pickle`, the runtime's
# `snapdiff-812-dev0-0001-step.snap`). A process's files in one folder are
# one run (see `snapdiff_runs`): batches never split them.
_SNAPSHOT = re.compile(r"\.(snap|pickle|pkl|json|pt|zip|gz|zst|xz|bz2)$")
_PROCESS = re.compile(r"^(?:(rank\d+|pid\d+)-step|snapdiff-(\d+-dev\d+)-)")


def _list_snapshots(path):
    """The snapshot files under `path` (a file, a folder searched
    recursively, or a URI), as (scheme prefix, path, query) triples: a
    file's URI is their concatenation. The query (`?endpoint_override=...`,
    for a server of the S3 protocol that is not AWS) is kept for each file."""
    import pyarrow.fs as pafs

    text = os.fspath(path)
    query = ""
    if "://" in text:
        fs, root = pafs.FileSystem.from_uri(text)
        scheme = text.split("://", 1)[0]
        prefix = f"{scheme}://"
        if "?" in text:
            query = "?" + text.split("?", 1)[1]
    else:
        fs, root, prefix = pafs.LocalFileSystem(), os.path.abspath(text), ""
    info = fs.get_file_info(root)
    if info.type == pafs.FileType.NotFound:
        raise FileNotFoundError(f"{text}: no such file or folder")
    if info.type == pafs.FileType.File:
        return [(prefix, root, query)]
    found = fs.get_file_info(pafs.FileSelector(root, recursive=True))
    return sorted(
        (prefix, f.path, query)
        for f in found
        if f.type == pafs.FileType.File and _SNAPSHOT.search(f.path)
        and not f.path.endswith(".owners.json")
    )


def _list_all(paths):
    """The snapshot files under each of `paths` (see `_list_snapshots`)."""
    return sorted(f for p in paths for f in _list_snapshots(p))


def _batches(files, count):
    """`files` in about `count` batches, each rank's files in one batch
    (ranks told by their names; other files by their folder)."""
    by_process = {}
    for prefix, path, query in files:
        name = os.path.basename(path)
        m = _PROCESS.match(name)
        key = (os.path.dirname(path), (m.group(1) or m.group(2)) if m else "")
        by_process.setdefault(key, []).append((prefix, path, query))
    groups = [by_process[k] for k in sorted(by_process)]
    size = max(1, -(-len(groups) // max(1, count)))
    return [sum(groups[i : i + size], []) for i in range(0, len(groups), size)]


def _export(files):
    """A Ray task: `snapdiff export` of `files`; returns the site tables
    as Arrow tables, and what export said (files, bytes, unreadable)."""
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq

    work = tempfile.mkdtemp(prefix="snapdiff-fleet-")
    try:
        local = []
        for prefix, path, query in files:
            if not prefix:
                local.append(path)
                continue
            # A file on remote storage: copied here with its folder's name
            # kept (and its manifest and owners), so that ranks are told,
            # and blocks' owners named, as at home.
            fs, _ = pafs.FileSystem.from_uri(prefix + path + query)
            folder = _local_folder(os.path.join(work, "in"), os.path.dirname(path))
            os.makedirs(folder, exist_ok=True)
            owners = os.path.splitext(os.path.basename(path))[0] + ".owners.json"
            for name in (os.path.basename(path), "manifest.jsonl", owners):
                source = os.path.dirname(path) + "/" + name
                target = os.path.join(folder, name)
                if os.path.exists(target):
                    continue
                if name != os.path.basename(path) and (
                    fs.get_file_info(source).type != pafs.FileType.File
                ):
                    continue
                with fs.open_input_stream(source) as src, open(target, "wb") as dst:
                    shutil.copyfileobj(src, dst)
            local.append(os.path.join(folder, os.path.basename(path)))
        out = os.path.join(work, "tables")
        code, stdout, stderr = run_with_paths(["export", "--json", "-o", out], local, check=False)
        if code not in (0, 2) or not stdout.strip():
            raise RuntimeError(stderr.strip() or f"snapdiff export exited with {code}")
        said = json.loads(stdout)
        said["node"] = _this_node()
        tables = {name: pq.read_table(os.path.join(out, name)) for name in _TABLES}
        return tables, said
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _local_folder(under, remote):
    """The folder under `under` standing for the remote folder `remote`
    (an object store's key prefix, which may hold `..`, `.` or empty
    parts): its parts kept as names, so that two remote folders are two
    local ones, and never a folder outside `under`."""
    parts = [
        part.replace("%", "%25") if part not in ("", ".", "..") else f"%{len(part)}"
        for part in remote.split("/")
    ]
    return os.path.join(under, *parts)


def _this_node():
    """The id of the Ray node this task runs on (None outside Ray)."""
    try:
        import ray

        return ray.get_runtime_context().get_node_id()
    except Exception:
        return None


def _last_line(error):
    """A Ray error in one line: the task's own exception, last."""
    lines = [l for l in str(error).strip().splitlines() if l.strip()]
    return lines[-1] if lines else type(error).__name__


def _node_ids(ray, keys):
    """Ray node ids for `keys`, each a node id or a node's IP address."""
    alive = [n for n in ray.nodes() if n.get("Alive")]
    ids = {}
    for key in keys:
        match = [n["NodeID"] for n in alive if key in (n["NodeID"], n.get("NodeManagerAddress"))]
        if not match:
            raise ValueError(f"{key}: no live Ray node has this id or address")
        ids[key] = match[0]
    return ids


def fleet_on_ray(paths, warmup, tables, tasks_per_cpu):
    """`snapdiff.fleet(paths, engine="ray")`: the files listed and read
    where they are, in Ray tasks of `snapdiff export`, their site tables
    brought together and judged here."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if not ray.is_initialized():
        ray.init()
    cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
    export = ray.remote(max_retries=TASK_RETRIES, retry_exceptions=True)(_export)
    listing = ray.remote(max_retries=TASK_RETRIES, retry_exceptions=True)(_list_all)

    # (files of the batch, scheduling options) for every task.
    work = []
    failed = []
    if isinstance(paths, dict):
        nodes = _node_ids(ray, paths)
        for key, node_paths in paths.items():
            on_node = {
                "scheduling_strategy": NodeAffinitySchedulingStrategy(nodes[key], soft=False)
            }
            if isinstance(node_paths, (str, bytes)) or hasattr(node_paths, "__fspath__"):
                node_paths = [node_paths]
            node_paths = [os.fspath(p) for p in node_paths]
            try:
                found = ray.get(listing.options(**on_node).remote(node_paths))
            except ray.exceptions.RayError as e:
                failed.append({"files": node_paths, "error": _last_line(e)})
                continue
            work += [(b, on_node) for b in _batches(found, cpus * tasks_per_cpu // len(paths) or 1)]
    else:
        if isinstance(paths, (str, bytes)) or hasattr(paths, "__fspath__"):
            paths = [paths]
        found = _list_all(paths)
        work = [(b, {}) for b in _batches(found, cpus * tasks_per_cpu)]
    if not work:
        said = "; ".join(f["error"] for f in failed) or ", ".join(map(str, paths))
        raise FileNotFoundError("no snapshot files: " + said)

    pending = {export.options(**opts).remote(batch): batch for batch, opts in work}
    parts = {name: [] for name in _TABLES}
    files = bytes_ = 0
    unreadable = []
    read_on = {}
    while pending:
        done, _ = ray.wait(list(pending), num_returns=1)
        batch = pending.pop(done[0])
        try:
            got, said = ray.get(done[0])
        except ray.exceptions.RayError as e:
            failed.append({"files": [p + f for p, f, _ in batch], "error": _last_line(e)})
            continue
        for name in _TABLES:
            parts[name].append(got[name])
        files += said["files"]
        bytes_ += said["bytes"]
        unreadable += said["unreadable"]
        if said.get("node"):
            read_on[said["node"]] = read_on.get(said["node"], 0) + said["files"]
    if not parts["sites.parquet"]:
        raise RuntimeError("every Ray task failed: " + "; ".join(f["error"] for f in failed))

    folder = tables or tempfile.mkdtemp(prefix="snapdiff-tables-")
    try:
        os.makedirs(folder, exist_ok=True)
        for name, pieces in parts.items():
            pq.write_table(pa.concat_tables(pieces), os.path.join(folder, name), compression="zstd")
        r = _fleet_json([folder], warmup)
    finally:
        if tables is None:
            shutil.rmtree(folder, ignore_errors=True)
    return _fleet_of(r, files=files, bytes_=bytes_, unreadable=unreadable, failed=failed,
                     read_on=read_on)
