"""Dumps of the capture hook: one snapshot written, its owners beside it,
its line in the manifest, and the pace of dumps kept to a share of the
job's time."""

import json
import os
import pickle
import secrets
import socket
import threading
import time

try:  # in the snapdiff package (snapdiff.recording)
    from .snapdiff_files import append, append_byte, create_new, describe, place, publish, remove, warn
except ImportError:  # capture's start-up hook: top-level modules
    from snapdiff_files import append, append_byte, create_new, describe, place, publish, remove, warn




MANIFEST = "manifest.jsonl"
# The share of the job's time dumps may take before the interval widens.
MAX_DUMP_SHARE = 0.10
# The machine, in each manifest line: with the process id, what tells two
# runs of one rank apart.
try:
    HOST = socket.gethostname()
except OSError:
    HOST = None
# Bytes a page, for the resident size in /proc/self/statm.
try:
    PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
except (AttributeError, ValueError, OSError):
    PAGE_SIZE = 4096


class Dumping:
    """The capture's dumps (a mixin of `snapdiff_capture.Capture`)."""

    def dump(self, reason):
        """Writes one snapshot; a failure is counted and reported, never raised."""
        if self.dumping_thread == threading.get_ident():
            return  # out of memory inside a dump of this thread's
        with self.dump_lock:
            if self.stopping.is_set() and reason not in ("exit", "oom"):
                return  # the process is ending: only its exit dump is taken
            self.dump_locked(reason)

    def dump_locked(self, reason):
        """`dump`, holding the dump lock."""
        if not self.recording or os.getpid() != self.pid:
            return
        if self.cpu is not None and self.cpu.storages_seen == 0:
            return  # a launcher of ranks, say: it made no tensor
        if reason == "signal" and self.settings.requests:
            append_byte(self.settings.requests + ".served")
        self.dumping = True
        self.dumping_thread = threading.get_ident()
        try:
            self.write_dump(reason)
        finally:
            self.dumping = False
            self.dumping_thread = None
        if self.ending_by is not None:
            self.end_now(reason)

    def temporary(self, name):
        """The path a file to be called `name` is written at until whole:
        unique, so that nobody can plant it, with the capture's run and the
        pid last, for capture's cleanup of what its killed processes were
        writing."""
        run = getattr(self.settings, "run", None) or "-"
        return os.path.join(
            self.settings.dir, f".{name}.{secrets.token_hex(4)}.{run}.{self.pid}.tmp"
        )

    def write_dump(self, reason):
        started = time.perf_counter()
        who, rank = self.who()
        stem = f"{who}-step{self.steps}" + ("" if reason == "step" else f"-{reason}")
        folder = self.settings.dir
        temporary = self.temporary(stem)
        measured = self.measure()
        owners = self.wants_owners(reason)
        found = None
        try:
            blocks = self.write(temporary, blocks=owners)
            # Searched before the dump is published, so that a dump is never
            # seen for long without its manifest line (a watch reading the
            # folder would take it for another run's).
            if owners:
                searched = time.perf_counter()
                found = self.find_owners(blocks, stem)
            name = place(temporary, folder, stem)
        except Exception as e:
            remove(temporary)
            self.failed(f"{stem}.pickle", e)
            self.note({"file": None, "error": str(e)}, rank, reason)
            return
        self.dumps += 1
        self.written.append(name)
        entry = {"file": name, **measured}
        if owners:
            entry["owners"] = self.write_owners(found, name) if found is not None else None
            entry["owners_seconds"] = round(time.perf_counter() - searched, 4)
        # How long this dump held the process, owners included.
        seconds = time.perf_counter() - started
        entry["seconds"] = round(seconds, 4)
        widened = self.pace(seconds, reason)
        if widened:
            entry["interval"] = round(widened, 3)
        if self.skipped:
            entry["skipped"] = self.skipped
        stopped = getattr(getattr(self, "cpu", None), "stopped", None)
        if stopped:
            entry["stopped"] = stopped  # this dump and later ones record nothing new
        self.note(entry, rank, reason)

    def measure(self):
        """What the process holds beside what the dump records: its
        resident bytes and, on CUDA, the bytes in use on its device (by
        every user of it), so that reports can tell growth outside the
        allocator. A figure that cannot be read is left out."""
        measured = {}
        try:
            with open("/proc/self/statm", "rb") as f:
                measured["rss_bytes"] = int(f.read().split()[1]) * PAGE_SIZE
        except (OSError, ValueError, IndexError):
            pass
        if self.cpu is None:
            try:
                free, total = self.torch.cuda.mem_get_info()
                measured["device_used_bytes"] = int(total - free)
            except Exception:
                pass
        return measured

    def pace(self, seconds, reason):
        """Counts a dump's time; after an interval dump, when dumps took
        more than MAX_DUMP_SHARE of the job's time so far, widens the
        interval to keep this dump under that share, says so once and
        returns the new interval (else None)."""
        self.dump_seconds += seconds
        self.last_seconds = seconds
        if reason != "interval" or not self.interval:
            return None
        elapsed = time.monotonic() - self.started
        wanted = seconds / MAX_DUMP_SHARE
        if self.dump_seconds <= MAX_DUMP_SHARE * elapsed or wanted <= self.interval:
            return None
        first = self.interval == self.settings.interval
        self.interval = wanted
        if first:
            warn(
                f"dumps took {self.dump_seconds / elapsed:.0%} of the job's time; interval "
                f"dumps now every {wanted:.1f} s instead of {self.settings.interval:g} s"
            )
        return wanted

    def wants_owners(self, reason):
        """Whether this dump is followed by its owners: when they are asked
        for, at every `owners_every`th dump and always at the job's last
        (exit, out of memory), and only on the main thread. The search asks
        PyTorch about every tensor; off the main thread it would do so while
        the job's own operators, the GIL released, change those tensors: a
        race inside PyTorch that can corrupt the job's heap. On the main
        thread a dump comes between two of the job's statements (a step's
        end, a SIGTERM, exit)."""
        if not getattr(self.settings, "owners", False):
            return False
        if threading.current_thread() is not threading.main_thread():
            return False
        self.dumps_since_owners += 1
        if reason in ("exit", "oom") or self.dumps_since_owners >= self.owners_every:
            self.dumps_since_owners = 0
            return True
        return False

    def ran_out_of_time(self, name, seconds):
        """A search that spent its whole budget: later searches come at
        every other dump of those they came at (said once), so that owners
        cost the job at most about one budget every `owners_every` dumps."""
        self.owners_every *= 2
        if self.owners_every == 2:
            warn(
                f"finding what holds the tensors of {name} took its whole budget "
                f"({seconds:g} s); owners are now searched at every other dump, and "
                f"fewer each time it happens again "
                f"(SNAPDIFF_OWNERS_BUDGET sets the budget; capture --no-owners turns "
                f"the search off)"
            )

    def find_owners(self, blocks, stem):
        """The owners of the dump's live blocks (`snapdiff_owners.find`);
        None when they could not be searched (said once, as failed dumps
        are)."""
        try:
            try:  # in the snapdiff package
                from . import snapdiff_owners
            except ImportError:  # capture's start-up hook
                import snapdiff_owners
            seconds = None
            if self.exit_deadline is not None:
                seconds = self.exit_deadline - time.monotonic()
                if seconds <= 0:
                    raise TimeoutError("no time left before the job ends")
                seconds = min(seconds, snapdiff_owners.budget())
            owners = snapdiff_owners.find(self.torch, blocks, seconds=seconds)
            if owners.get("complete") is False:
                self.ran_out_of_time(stem, seconds or snapdiff_owners.budget())
            return owners
        except Exception as e:
            self.failed(f"owners of {stem}", e)
            return None

    def write_owners(self, owners, name):
        """Writes `owners` beside the dump `name` (`NAME.owners.json`) and
        returns that file's name; None when it could not be written (said
        once, as failed dumps are)."""
        temporary = None
        try:
            owners_name = name.rsplit(".", 1)[0] + ".owners.json"
            folder = self.settings.dir
            temporary = self.temporary(owners_name)
            with create_new(temporary, "w") as f:
                json.dump(owners, f)
            publish(temporary, os.path.join(folder, owners_name))
            return owners_name
        except Exception as e:
            if temporary is not None:
                remove(temporary)
            self.failed(f"owners of {name}", e)
            return None

    def write(self, path, blocks=False):
        """Writes the dump to `path`, a new file; returns its live blocks
        [(address, size)] when `blocks` (for the owners search), else None."""
        root = self.settings.stack_root
        names = self.settings.file_names
        names = names() if names is not None else None

        def frames_of(frames):
            if root is not None:
                frames = cut_frames(frames, *root)
            return renamed_frames(frames, names) if names else frames

        if hasattr(self.cpu, "write"):
            # The allocator recorder pickles the snapshot itself, faster.
            with create_new(path, "wb") as f:
                key = (root, dict(names) if names else None)
                return self.cpu.write(f, frames_of, key=key, blocks=blocks)
        if self.cpu is not None:
            snapshot = self.cpu.snapshot()
        else:
            # What `torch.cuda.memory._dump_snapshot` pickles, into a file
            # opened here (it would follow a link at `path`).
            snapshot = self.torch.cuda.memory._snapshot()
            mark_steps(snapshot, self.step_times)
        for_each_stack(snapshot, frames_of)
        with create_new(path, "wb") as f:
            pickle.dump(snapshot, f, protocol=4)
        if not blocks:
            return None
        return [
            (b["address"], b["size"])
            for segment in snapshot.get("segments", ())
            for b in segment.get("blocks", ())
            if b.get("state") == "active_allocated"
        ]

    def who(self):
        """`rank{R}` under torchrun or a rank set in RANK, else `pid{PID}`.
        A rank once known is kept: after `destroy_process_group()` the exit
        dump is still the rank's."""
        rank = os.environ.get("RANK")
        if rank is None:
            try:
                dist = self.torch.distributed
                if dist.is_available() and dist.is_initialized():
                    rank = str(dist.get_rank())
            except Exception:
                rank = None
        if rank is not None and rank.isdigit():
            self.rank = int(rank)
        if self.rank is not None:
            return f"rank{self.rank}", self.rank
        return f"pid{self.pid}", None

    def note(self, entry, rank, reason):
        """Appends the dump's line to the manifest (one write, so lines of
        several processes never interleave; never through a link)."""
        device = "cpu"
        if self.cpu is None:
            try:
                device = f"cuda:{self.torch.cuda.current_device()}"
            except Exception:
                device = "cuda"
        entry.update(
            rank=rank, pid=self.pid, host=HOST, device=device, step=self.steps,
            time=round(time.time(), 6), reason=reason,
        )
        if getattr(self.settings, "run", None):
            entry["run"] = self.settings.run
        line = (json.dumps(entry) + "\n").encode()
        try:
            append(os.path.join(self.settings.dir, MANIFEST), line)
        except OSError as e:
            if not self.manifest_refused:
                self.manifest_refused = True
                warn(f"cannot write {MANIFEST} ({describe(e)}); dumps go on without it")

    def failed(self, name, error):
        """Reports the first failure in full; later ones are counted."""
        self.failures += 1
        self.last_failure = f"{name}: {describe(error)}"
        if self.failures == 1:
            warn(f"cannot write {name} ({describe(error)}); training goes on")

    def report_failures(self):
        if self.failures > 1:
            warn(f"{self.failures} snapshot writes failed; the last: {self.last_failure}")


def mark_steps(snapshot, step_times):
    """Puts a `step` event (its size the steps taken before it, as the CPU
    recorders write it) into each device's trace where each of
    `step_times`, `(step, time_us)` in order, falls among its events, so
    that reports cut the trace at the job's own steps. PyTorch's trace has
    no way to be told them while it records."""
    if not step_times:
        return
    for d, trace in enumerate(snapshot.get("device_traces") or ()):
        if not trace or trace[0].get("time_us") is None:
            continue
        first = trace[0]["time_us"]
        marks = [(step, t) for step, t in step_times if t >= first]
        if not marks:
            continue
        merged = []
        pending = iter(marks)
        mark = next(pending, None)
        for event in trace:
            t = event.get("time_us")
            while mark is not None and t is not None and mark[1] < t:
                merged.append(_step_event(mark))
                mark = next(pending, None)
            merged.append(event)
        while mark is not None:
            merged.append(_step_event(mark))
            mark = next(pending, None)
        snapshot["device_traces"][d] = merged


def _step_event(mark):
    step, time_us = mark
    return {"action": "step", "addr": 0, "size": step, "stream": 0, "time_us": time_us,
            "frames": []}


def each_record(snapshot):
    """Every record of `snapshot` that has frames: segments, blocks, their
    history, trace events."""
    for segment in snapshot.get("segments", []):
        yield segment
        for block in segment.get("blocks", []):
            yield block
            yield from block.get("history", [])
    for trace in snapshot.get("device_traces", []):
        yield from trace


def for_each_stack(snapshot, frames_of):
    """Gives every record of `snapshot` `frames_of` its frames instead.
    Frame lists shared between records stay shared."""
    done = {}  # id of a frame list -> (it, what it became), keeping it alive
    for record in each_record(snapshot):
        frames = record.get("frames")
        if isinstance(frames, list):
            made = done.get(id(frames))
            if made is None:
                made = done[id(frames)] = (frames, frames_of(frames))
            record["frames"] = made[1]


def renamed_frames(frames, names):
    """`frames` with each frame whose file is a key of `names` given that
    name instead (a notebook's cells: see `snapdiff._notebook`): new dicts
    for those frames, the list itself when none is."""
    if not any(f.get("filename") in names for f in frames):
        return frames
    return [dict(f, filename=names[f["filename"]]) if f.get("filename") in names else f
            for f in frames]


def cut_frames(frames, filename, name):
    """`frames` without the frames that called function `name` of
    `filename` (a test's, whose callers are pytest's and pluggy's); the list
    itself when it has no such function."""
    end = next(
        (i for i, f in enumerate(frames)
         if f.get("name") == name and f.get("filename") == filename),
        None,
    )
    return frames if end is None else frames[: end + 1]
