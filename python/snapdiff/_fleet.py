"""One verdict for a whole job of many ranks: `snapdiff fleet`, here or
on a Ray cluster.

Locally, `fleet(paths)` runs `snapdiff fleet --json`. With
`engine="ray"`, the reading is done where the files are: Ray tasks run
`snapdiff export` on batches of ranks (from shared storage, any URI
`pyarrow.fs` opens, or each node's own disk), hand back Arrow tables, and
the driver writes them as one Parquet folder and judges it with
`snapdiff fleet`, the same Rust code as the local path.
"""

import json
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Union

from snapdiff._api import Culprit, PathArg, Site, Suspect, _site, _suspect, path_list
from snapdiff._cli import run_with_paths
from snapdiff._limits import size_text

# Ray retries a task this many times (a worker that died, or an error
# raised in it) before its files are named in `Fleet.failed`.
TASK_RETRIES = 2

_TABLES = ("sites.parquet", "checkpoints.parquet", "stacks.parquet", "owners.parquet")
# The rules of `snapdiff_format::names` (docs/format.md, "File names").


@dataclass
class RankVerdict:
    """One device of one rank: its verdict and the evidence."""

    process: str
    rank: Optional[int]
    device: int
    verdict: str
    suspected_bytes: int
    suspects: List[Suspect]
    checkpoints: List[dict]
    notes: List[str]


@dataclass
class FleetLeak:
    """A line that leaks on some ranks, with each rank's growth a step."""

    site: Site
    ranks: List[Optional[int]]
    growth_per_step: List[Optional[float]]
    growth_bytes: int
    # What kept its blocks alive (capture's owners files), as in `Suspect`.
    held_by: List[dict] = field(default_factory=list)

    @property
    def culprit(self) -> Culprit:
        """The site's culprit: the line to look at first."""
        return self.site.culprit

    def rate(self) -> str:
        """The leaking ranks' growth a step, as one size or a range."""
        known = sorted(g for g in self.growth_per_step if g is not None)
        if not known:
            return "growth a step unknown"
        low, high = size_text(known[0]), size_text(known[-1])
        return f"{low} a step" if low == high else f"{low} to {high} a step"

    def __repr__(self):
        return f"<FleetLeak {self.site.culprit}: {len(self.ranks)} ranks, {self.rate()}>"


@dataclass
class Imbalance:
    """A line where some ranks hold far more than the median rank."""

    site: Site
    step: Optional[int]
    median_bytes: int
    ranks: List[Optional[int]]
    excess_bytes: List[int]


@dataclass
class OutsideGrowth:
    """Memory that keeps growing outside every recorded site on one rank's
    device (what no site names: numpy arrays, NCCL's or cuBLAS's buffers):
    `what` is `process` (its resident memory beyond the recorded memory)
    or `device` (the device's use beyond the allocator's reserved bytes)."""

    rank: Optional[int]
    process: str
    device: int
    what: str
    growth_bytes: int
    growth_per_step: Optional[float]

    def __str__(self):
        where = ("the process's resident memory" if self.what == "process"
                 else "the device's memory beyond the allocator")
        rate = (f"{size_text(self.growth_per_step)} a step" if self.growth_per_step is not None
                else f"{size_text(self.growth_bytes)} in all")
        return f"{where}, +{rate}"


@dataclass
class Fleet:
    """`snapdiff fleet`: counts, leaking lines, imbalance, and every rank."""

    processes: int
    steady: int
    leaking: int
    too_few_checkpoints: int
    files: int
    bytes: int
    unreadable: List[dict]
    leaks: List[FleetLeak]
    imbalance: List[Imbalance]
    ranks: List[RankVerdict]
    notes: List[str]
    # Ray tasks that failed after their retries: their files and the error.
    failed: List[dict] = field(default_factory=list)
    # Ranks whose memory outside the recorded sites keeps growing.
    outside: List[OutsideGrowth] = field(default_factory=list)
    # With engine="ray": the snapshot files each Ray node read, by node id.
    read_on: Dict[str, int] = field(default_factory=dict)

    def counts(self) -> str:
        """`48 ranks: 46 steady, 2 leaking`, then memory growing outside
        the recorded sites, then what could not be judged: ranks with too
        few checkpoints, unreadable files, failed Ray tasks."""
        said = f"{self.processes} ranks: {self.steady} steady, {self.leaking} leaking"
        outside = len({(o.process, o.device) for o in self.outside})
        for n, what in ((outside, "with memory growing outside the recorded sites"),
                        (self.too_few_checkpoints, "with too few checkpoints to judge"),
                        (len(self.unreadable), "unreadable"),
                        (len(self.failed), "in failed Ray tasks")):
            if n:
                said += f", {n} {what}"
        return said

    def __str__(self):
        lines = [self.counts()]
        lines += [f"  leaks on {_ranks(l.ranks)}: {l.site.culprit}, {l.rate()}" for l in self.leaks]
        lines += [f"  imbalance on {_ranks(i.ranks)}: {i.site.culprit}, "
                  f"{size_text(max(i.excess_bytes, default=0))} over the median"
                  for i in self.imbalance]
        lines += [f"  outside the recorded sites on {_ranks([o.rank])}: {o}" for o in self.outside]
        lines += [f"  unreadable: {u['source']}: {u.get('error', '')}" for u in self.unreadable]
        lines += [f"  {_failed(f)}" for f in self.failed]
        return "\n".join(lines)

    def __repr__(self):
        return f"<Fleet {self.counts()}>"

    def _repr_html_(self):
        """The verdict as a notebook shows it: counts (with what could not
        be judged), leaking lines and imbalance, every text escaped."""
        import html

        e = html.escape
        parts = [f"<div class='snapdiff'><p>{e(self.counts())}</p>"]
        if self.leaks:
            rows = "".join(
                f"<tr><td>{e(_ranks(l.ranks))}</td><td>{e(str(l.site.culprit))}</td>"
                f"<td>{e(l.rate())}</td></tr>"
                for l in self.leaks
            )
            parts.append("<table><tr><th>ranks</th><th>leaking line</th><th>growth</th></tr>"
                         f"{rows}</table>")
        if self.imbalance:
            rows = "".join(
                f"<tr><td>{e(_ranks(i.ranks))}</td><td>{e(str(i.site.culprit))}</td>"
                f"<td>{e(size_text(max(i.excess_bytes, default=0)))}</td></tr>"
                for i in self.imbalance
            )
            parts.append("<table><tr><th>ranks</th><th>imbalanced line</th>"
                         f"<th>most over the median</th></tr>{rows}</table>")
        if self.outside:
            rows = "".join(
                f"<tr><td>{e(_ranks([o.rank]))}</td><td>{e(str(o))}</td></tr>"
                for o in self.outside
            )
            parts.append("<table><tr><th>rank</th><th>memory growing outside the recorded "
                         f"sites</th></tr>{rows}</table>")
        unjudged = [f"unreadable: {u['source']}: {u.get('error', '')}" for u in self.unreadable]
        unjudged += [_failed(f) for f in self.failed]
        if unjudged:
            parts.append("<ul>" + "".join(f"<li>{e(str(u))}</li>" for u in unjudged) + "</ul>")
        parts.append("</div>")
        return "".join(parts)


def _failed(task):
    return f"a failed Ray task ({len(task['files'])} files): {task['error']}"


def _ranks(ranks):
    """`0, 3, 7` (a rank not known reads `?`)."""
    return ", ".join("?" if r is None else str(r) for r in ranks)


def _fleet_of(r, files=None, bytes_=None, unreadable=(), failed=(), read_on=None):
    return Fleet(
        processes=r["processes"],
        steady=r["steady"],
        leaking=r["leaking"],
        too_few_checkpoints=r["too_few_checkpoints"],
        files=r["files"] if files is None else files,
        bytes=r["bytes"] if bytes_ is None else bytes_,
        unreadable=sorted(r["unreadable"] + list(unreadable), key=lambda u: u["source"]),
        leaks=[
            FleetLeak(
                site=_site(r, l["site"]),
                ranks=[m["rank"] for m in l["members"]],
                growth_per_step=[m.get("growth_per_step") for m in l["members"]],
                growth_bytes=l["growth_bytes"],
                held_by=l.get("held_by", []),
            )
            for l in r["leaks"]
        ],
        imbalance=[
            Imbalance(
                site=_site(r, i["site"]),
                step=i.get("step"),
                median_bytes=i["median_bytes"],
                ranks=[m["rank"] for m in i["members"]],
                excess_bytes=[m["excess_bytes"] for m in i["members"]],
            )
            for i in r["imbalance"]
        ],
        ranks=[
            RankVerdict(
                process=m["process"],
                rank=m.get("rank"),
                device=m["device"],
                verdict=m["verdict"],
                suspected_bytes=m["suspected_bytes"],
                suspects=[_suspect(r, s) for s in m["suspects"]],
                checkpoints=m["checkpoints"],
                notes=m["notes"],
            )
            for m in r["members"]
        ],
        notes=r["notes"],
        failed=list(failed),
        read_on=dict(read_on or {}),
        outside=[
            OutsideGrowth(
                rank=m.get("rank"),
                process=m["process"],
                device=m["device"],
                what=what,
                growth_bytes=growth["growth_bytes"],
                growth_per_step=growth.get("growth_per_step"),
            )
            for m in r["members"]
            for what in ("process", "device")
            for growth in [(m.get("outside") or {}).get(what)]
            if growth and growth.get("grows")
        ],
    )


def _fleet_json(paths, warmup):
    """`snapdiff fleet --json` on `paths`; files that could not be read
    (exit code 2) still give a verdict."""
    options = [] if warmup is None else ["--warmup", warmup]
    code, out, err = run_with_paths(["fleet", *options, "--json", "--top", "0"], paths, check=False)
    # 2: some files unreadable, 3: no rank judgeable; both still a verdict.
    if code not in (0, 1, 2, 3) or not out.strip():
        raise RuntimeError(err.strip() or f"snapdiff exited with {code}")
    return json.loads(out)


def fleet(
    paths: Union[PathArg, Iterable[PathArg], Dict[str, List[PathArg]]],
    engine: Optional[str] = None,
    warmup: Optional[int] = None,
    tables: Optional[PathArg] = None,
    tasks_per_cpu: int = 4,
) -> "Fleet":
    """One verdict for a whole job: which ranks leak, at which line and how
    fast, and which ranks hold far more than their peers.

    `paths`: snapshot files, folders (searched recursively) and site-table
    folders; one path or a list. With `engine="ray"` (the cluster of
    `ray.init()`), also any URI `pyarrow.fs` opens (`s3://bucket/job/`), or
    a dict `{node_id_or_ip: [paths]}` of files on each node's own disk,
    read there. `tables`: a folder to keep the Parquet site tables in (Ray
    only; a temporary one otherwise).
    """
    if engine in (None, "local"):
        if isinstance(paths, dict):
            raise ValueError("paths per node need engine='ray'")
        return _fleet_of(_fleet_json(path_list(paths), warmup))
    if engine != "ray":
        raise ValueError(f"engine must be None or 'ray', not {engine!r}")
    from snapdiff._ray import fleet_on_ray

    return fleet_on_ray(paths, warmup, tables, tasks_per_cpu)
