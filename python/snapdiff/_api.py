"""The command's reports as plain dataclasses, read from its `--json`."""

from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Sequence, Union

import os

#: A path as the functions take it: text, bytes or any `os.PathLike`.
PathArg = Union[str, bytes, "os.PathLike[str]", "os.PathLike[bytes]"]

from snapdiff._cli import one_trend, run_json
from snapdiff._limits import size_text


@dataclass
class Culprit:
    """The frame to look at first: the innermost line of your own code.

    `kind` says how it was chosen: "user", "focus", "forward" (a backward
    allocation, named by the forward line that caused it), "fallback" or
    "no_stack"."""

    name: str
    file: str
    line: int
    kind: str

    def __str__(self):
        prefix = "backward of " if self.kind == "forward" else ""
        return f"{prefix}{self.name}  {self.file}:{self.line}"


@dataclass
class Site:
    """The allocations of one code path: its culprit and its frames
    (innermost first, as `function file:line`)."""

    culprit: Culprit
    frames: List[str]
    #: What PyTorch recorded with the site's allocations, when anything:
    #: `labels` (`_annotate_memory`), `compiled_regions` (`compile_context`),
    #: `metadata` (`_set_memory_metadata`).
    recorded: Dict[str, List[str]] = field(default_factory=dict)


@dataclass
class Group:
    """One site's change between two snapshots (bytes are requested sizes)."""

    site: Site
    change: str  # "grew", "shrank", "new", "gone", "rounding"
    blocks_before: int
    blocks_after: int
    bytes_before: int
    bytes_after: int
    delta_bytes: int
    #: Between two runs, where the site was when its code moved.
    moved_from: Optional[Culprit] = None

    @property
    def culprit(self) -> Culprit:
        """The site's culprit: the line to look at first."""
        return self.site.culprit

    def __repr__(self):
        return f"<Group {self.site.culprit}: {_signed(self.delta_bytes)}>"


def _signed(n):
    return ("+" if n > 0 else "") + size_text(n)


class _AsReport:
    """A command's report: `str()` is the command's own text, the same
    verdict with the same options; a notebook shows the offline report of
    its files (see `snapdiff._notebook`)."""

    _options: Sequence[str] = ()  # the command's options the report was made with

    def __str__(self):
        from snapdiff._notebook import text_of

        return text_of(self._command, self.files, self._options).rstrip("\n")

    def _repr_html_(self):
        from snapdiff._notebook import report_html, text_of

        text = text_of(self._command, self.files, self._options)
        return report_html(self.files, text, self._options)


@dataclass
class Comparison(_AsReport):
    """`snapdiff compare`."""

    leaked_bytes: int
    allocated_before: int
    allocated_after: int
    reserved_before: int
    reserved_after: int
    groups: List[Group]
    notes: List[str]
    #: 1 for two moments of one run, 2 for two runs (compared site by site).
    runs: int = 1
    #: What said the files are two runs; "" for one.
    runs_told_by: str = ""
    #: The rows that grew and those that shrank, in bytes: the split of the
    #: net change.
    grown_bytes: int = 0
    shrunk_bytes: int = 0
    #: Between two runs whose files hold traces, the highest live bytes of
    #: any device inside each; None otherwise.
    peak_before: Optional[int] = None
    peak_after: Optional[int] = None
    #: Pinned host memory (host RAM, never in the figures above) `before`
    #: and `after`, when either file recorded it: dicts of
    #: `reserved_bytes`, `in_use_bytes`, `cached_bytes`, `cached_blocks`...
    pinned_host: Optional[dict] = None
    files: List[str] = field(default_factory=list, repr=False, compare=False)
    _command = "compare"

    def __repr__(self):
        if self.runs == 2:
            net = self.allocated_after - self.allocated_before
            return (f"<Comparison of two runs: {_signed(net)} allocated, "
                    f"{_signed(self.grown_bytes)} grown, {_signed(-self.shrunk_bytes)} shrunk>")
        grew = sum(g.delta_bytes > 0 for g in self.groups)
        return (f"<Comparison: {_signed(self.leaked_bytes)} live, "
                f"{grew} site{'s' * (grew != 1)} grew>")


@dataclass
class Suspect:
    """A site whose memory keeps growing, with the evidence."""

    site: Site
    growth_bytes: int
    growth_per_step: Optional[float]
    growth_per_checkpoint: int
    series: List[int]
    floor: List[int]
    blocks: List[int]
    # What kept its blocks alive (capture's owners files): dicts of `owner`,
    # `kind`, `container`, `example`, `blocks`, `bytes`, `blocks_per_step`.
    held_by: List[dict] = field(default_factory=list)

    @property
    def culprit(self) -> Culprit:
        """The site's culprit: the line to look at first."""
        return self.site.culprit

    def rate(self) -> str:
        """`64.00 KiB a step`, or a checkpoint when steps are unknown."""
        if self.growth_per_step is not None:
            return f"{size_text(self.growth_per_step)} a step"
        return f"{size_text(self.growth_per_checkpoint)} a checkpoint"

    def __str__(self):
        held = self.held_by[0]["owner"] if self.held_by else None
        return (f"{self.site.culprit}: {self.rate()}, {size_text(self.growth_bytes)} "
                "after warm-up" + (f", held by {held}" if held else ""))

    def __repr__(self):
        return f"<Suspect {self.site.culprit}: {self.rate()}>"


@dataclass
class LiveSite:
    """A site's live memory in one snapshot, and what kept it alive
    (`Recording.owners()`)."""

    site: Site
    blocks: int
    bytes: int
    # Its owners, the owner of more blocks first: dicts of `owner`, `kind`,
    # `container`, `example`, `blocks`, `bytes`, as `Suspect.held_by`.
    held_by: List[dict] = field(default_factory=list)

    @property
    def culprit(self) -> Culprit:
        """The site's culprit: the line to look at first."""
        return self.site.culprit

    def __str__(self):
        held = self.held_by[0]["owner"] if self.held_by else "no owner found"
        return f"{self.site.culprit}: {size_text(self.bytes)} live, held by {held}"

    def __repr__(self):
        return f"<LiveSite {self.site.culprit}: {size_text(self.bytes)}>"


def live_sites(report) -> List[LiveSite]:
    """The sites of `snapdiff summary --json`'s report, with their owners."""
    return [
        LiveSite(
            site=_site(report, s),
            blocks=s["blocks"],
            bytes=s["bytes"],
            held_by=s.get("held_by", []),
        )
        for s in report["top_sites"]
    ]


@dataclass
class Trend(_AsReport):
    """`snapdiff trend`."""

    checkpoints: int
    checkpoint_source: str
    suspects: List[Suspect]
    suspected_bytes: int
    notes: List[str] = field(default_factory=list)
    #: Why there is no verdict (too few checkpoints, one pass), or None.
    no_verdict: Optional[str] = None
    #: Pinned host memory over the run, judged on its own (`grows`,
    #: `first`, `last`, `rises`...), when the snapshots recorded it.
    pinned_host: Optional[dict] = None
    #: Memory outside what the snapshots record (`device`, `process`, each
    #: with `grows`), when capture measured it.
    outside: Optional[dict] = None
    files: List[str] = field(default_factory=list, repr=False, compare=False)
    _command = "trend"

    def outside_grows(self) -> bool:
        """Whether memory outside the recorded sites keeps growing (the
        process's resident memory, the device's use beyond the allocator)."""
        parts = (self.outside or {}).values()
        return any(isinstance(p, dict) and p.get("grows") for p in parts)

    def __repr__(self):
        if self.no_verdict:
            said = "no verdict"
        elif not self.suspects and self.outside_grows():
            said = "no site keeps growing; memory outside the sites does"
        elif not self.suspects and self.pinned_host and self.pinned_host["grows"]:
            said = "no device site keeps growing; pinned host memory does"
        elif not self.suspects:
            said = "nothing keeps growing"
        else:
            n = len(self.suspects)
            said = (f"{n} site{'s' * (n != 1)} keep{'s' * (n == 1)} growing, "
                    f"{size_text(self.suspected_bytes)}; first {self.suspects[0].site.culprit}")
        return f"<Trend of {self.checkpoints} checkpoints: {said}>"


@dataclass
class DevicePeak:
    """One device's highest point and what held it."""

    device: int
    allocated_bytes: int
    event_index: int
    categories: dict
    sites: List[Site]
    site_bytes: List[int]


@dataclass
class Peak(_AsReport):
    """`snapdiff peak`."""

    devices: List[DevicePeak]
    notes: List[str]
    files: List[str] = field(default_factory=list, repr=False, compare=False)
    _command = "peak"

    def __repr__(self):
        said = ", ".join(f"device {d.device} at {size_text(d.allocated_bytes)}"
                         for d in self.devices)
        return f"<Peak: {said or 'no device'}>"


def _moved_from(entry) -> Optional[Culprit]:
    moved = entry.get("moved_from")
    if moved is None:
        return None
    c = moved["culprit"]
    return Culprit(c["name"], c["file"], c["line"], c["kind"])


def _site(report, entry):
    c = entry["culprit"]
    frames = report.get("frames", [])
    stack = report.get("stacks", [])[entry["stack"]] if entry.get("stack") is not None else []
    return Site(
        culprit=Culprit(c["name"], c["file"], c["line"], c["kind"]),
        frames=[
            f"{frames[i]['name']}  {frames[i]['file']}:{frames[i]['line']}" for i in stack
        ],
        recorded=entry.get("recorded", {}),
    )


def _suspect(report, entry):
    return Suspect(
        site=_site(report, entry),
        growth_bytes=entry["growth_bytes"],
        growth_per_step=entry.get("growth_per_step"),
        growth_per_checkpoint=entry["growth_per_checkpoint"],
        series=entry["series"],
        floor=entry["floor"],
        blocks=entry["blocks"],
        held_by=entry.get("held_by", []),
    )


def compare(before: PathArg, after: PathArg) -> Comparison:
    """What holds more memory in `after` than in `before`, by site."""
    r = run_json("compare", [before, after])
    return Comparison(
        leaked_bytes=r["leaked_bytes"],
        allocated_before=r["allocated_before"],
        allocated_after=r["allocated_after"],
        reserved_before=r["reserved_before"],
        reserved_after=r["reserved_after"],
        groups=[
            Group(
                site=_site(r, g),
                change=g["change"],
                blocks_before=g["blocks_before"],
                blocks_after=g["blocks_after"],
                bytes_before=g["bytes_before"],
                bytes_after=g["bytes_after"],
                delta_bytes=g["delta_bytes"],
                moved_from=_moved_from(g),
            )
            for g in r["groups"]
        ],
        notes=r["notes"],
        runs=r["runs"]["count"],
        runs_told_by=r["runs"]["told_by"],
        grown_bytes=r["grown"]["bytes"],
        shrunk_bytes=r["shrunk"]["bytes"],
        peak_before=r.get("peak_before"),
        peak_after=r.get("peak_after"),
        pinned_host=r.get("pinned_host"),
        files=[os.fsdecode(before), os.fsdecode(after)],
    )


def path_list(paths: Union[PathArg, Iterable[PathArg]]) -> List[str]:
    """One path or several, as text."""
    if isinstance(paths, (str, bytes, os.PathLike)):
        return [os.fsdecode(paths)]
    return [os.fsdecode(p) for p in paths]


def trend(files: Union[PathArg, Iterable[PathArg]], warmup: Optional[int] = None) -> Trend:
    """The sites whose memory keeps growing over `files` (snapshots, a
    folder of them, or one trace)."""
    paths = path_list(files)
    options = [] if warmup is None else ["--warmup", str(warmup)]
    report = run_json("trend", paths, options)
    r = one_trend(report)
    if r is None:
        raise ValueError(
            "the files come from several processes; give one process's files at a time"
        )
    result = Trend(
        checkpoints=r["checkpoints"],
        checkpoint_source=r["checkpoint_source"],
        suspects=[_suspect(r, s) for s in r["suspects"]],
        suspected_bytes=r["suspected_bytes"],
        notes=r["notes"],
        no_verdict=r.get("no_verdict"),
        pinned_host=r.get("pinned_host"),
        outside=r.get("outside"),
        files=paths,
    )
    result._options = options
    return result


def peak(file: PathArg) -> Peak:
    """The moment each device held the most memory, and what held it."""
    r = run_json("peak", [file])
    return Peak(
        devices=[
            DevicePeak(
                device=d["device"],
                allocated_bytes=d["allocated_bytes"],
                event_index=d["event_index"],
                categories={c["category"]: c["bytes"] for c in d["categories"]},
                sites=[_site(r, s) for s in d["sites"]],
                site_bytes=[s["bytes"] for s in d["sites"]],
            )
            for d in r["devices"]
        ],
        notes=r["notes"],
        files=[os.fsdecode(file)],
    )
