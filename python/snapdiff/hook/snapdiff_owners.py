"""Who keeps a block of memory alive: the live tensors whose storage lies
in it, and a short path of references from a root of the program (a
module's global, a live frame's local) to each, written as the user would
write it (`train.history[13]`, `evaluate (train.py:88): total_loss`).

A tensor saved for backward is reached through the autograd graph of a
live tensor (its `grad_fn`, the nodes' `next_functions` and saved tensors):
the graph of a value kept across steps keeps every step's activations.
A tensor no root reaches is held by a reference cycle only, and goes at
the next garbage collection; a block no live tensor lies in is the
allocator's (its cache) or C++ code's.

The search pauses the garbage collector and restores it, keeps no
reference once it returns (its lists and maps are dropped), never raises,
and stops at its time budget (`SNAPDIFF_OWNERS_BUDGET` seconds, 1 by
default), saying so in its result.
"""

import bisect
import gc
import os
import site
import sys
import sysconfig
import time

BUDGET_S = 1.0
# The search's own frames, and snapdiff's (the package around the hook,
# when it is installed), are not roots.
_HOOK = os.path.dirname(os.path.abspath(__file__))
_PACKAGE = os.path.dirname(_HOOK)
_OURS = (os.path.join(_HOOK, ""),) + (
    (os.path.join(_PACKAGE, ""),) if os.path.basename(_PACKAGE) == "snapdiff" else ()
)


def _library_folders():
    """Where installed packages and the standard library live: their frames
    (torch's optimizer wrapper, pytest's runner) are not roots; the user's
    own frames and every module's globals are."""
    folders = set()
    try:
        folders.update(site.getsitepackages())
        folders.add(site.getusersitepackages())
    except Exception:
        pass
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        try:
            folders.add(sysconfig.get_path(key))
        except Exception:
            pass
    return tuple(os.path.join(f, "") for f in folders if f)
# Objects whose references lead to no step's data, or only back to a
# module (already a root): not followed. Functions are followed into
# their closures and defaults only.
_LEAVES = (
    type(sys),
    type,
    type((lambda: 0).__code__),
    type(len),
    type(str.join),
    type(int.real),
    type(object.__init__),
)
_FUNCTION = type(lambda: 0)
# Unreached tensors whose referrers are looked for (each look scans every
# object): the rest are not named.
_MOST_CHECKED = 64
_CYCLE = {
    "owner": "a reference cycle",
    "group": "a reference cycle",
    "container": None,
    "kind": "cycle",
}
_NATIVE = {
    "owner": "C++ code (no Python object refers to it)",
    "group": "C++ code (no Python object refers to it)",
    "container": None,
    "kind": "native",
}


def budget():
    """The time budget in seconds, from the environment."""
    try:
        value = float(os.environ.get("SNAPDIFF_OWNERS_BUDGET") or BUDGET_S)
        return value if value > 0 else BUDGET_S
    except ValueError:
        return BUDGET_S


def find(torch, blocks, seconds=None, skip=()):
    """Owners of `blocks`, a list of (address, size) of live blocks:
    `{"complete", "seconds", "objects", "tensors", "blocks": {address:
    owner}}`, each owner a dict of `owner` (the path), `group` (the
    container, for grouping), `container` (its type), `kind` (`global`,
    `local`, `autograd`, `cycle`), and `via_graph` (the graph's root, for
    `autograd`). Blocks no tensor lies in are left out. Never raises: an
    error is returned as `{"error": ...}`. `skip`: frames not to take as
    roots (the caller's)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _Search(torch, blocks, seconds or budget(), skip).run()
    except Exception as e:  # never into the job
        return {"error": f"{type(e).__name__}: {e}", "blocks": {}}
    finally:
        if enabled:
            gc.enable()


class _Search:
    def __init__(self, torch, blocks, seconds, skip):
        self.torch = torch
        self.starts = sorted(a for a, _ in blocks)
        self.sizes = dict(blocks)
        self.deadline = time.perf_counter() + seconds
        self.started = time.perf_counter()
        self.skip = {id(f) for f in skip}
        # id -> object for everything met, so that ids stay valid; and id
        # -> (parent id, how the parent holds it: None to work it out).
        self.objects = {}
        self.parent = {}
        self.roots = {}  # id -> (label, kind)

    def block_of(self, tensor):
        """The address of the block the tensor's storage lies in, if any."""
        try:
            ptr = tensor.untyped_storage().data_ptr()
        except Exception:
            return None
        i = bisect.bisect_right(self.starts, ptr) - 1
        if i >= 0 and ptr < self.starts[i] + self.sizes[self.starts[i]]:
            return self.starts[i]
        return None

    def run(self):
        Tensor = self.torch.Tensor
        everything = gc.get_objects()
        targets = {}
        tensors = {}
        for o in everything:
            # type(), not isinstance(): an object's __class__ may be a
            # property that warns or raises.
            if issubclass(type(o), Tensor):
                block = self.block_of(o)
                if block is not None:
                    targets[id(o)] = block
                    tensors[id(o)] = o
        objects = len(everything)
        del everything
        found = {}
        complete = self.walk(targets, found)
        # Tensors no root reaches: held by a reference cycle (another
        # Python object refers to them), else from outside Python (C++
        # code: a graph's saved tensor whose Python object PyTorch keeps).
        # Each look scans the whole heap, so the budget bounds them too,
        # from the second on (the first is always made, so that a lone
        # unreached tensor is always told).
        if complete:
            checked = 0
            for tid, block in targets.items():
                if block in found or tid in self.parent:
                    continue
                if checked >= _MOST_CHECKED:
                    break
                if checked and time.perf_counter() > self.deadline:
                    complete = False
                    break
                checked += 1
                referrers = [r for r in gc.get_referrers(tensors[tid]) if r is not tensors]
                found[block] = _CYCLE if referrers else _NATIVE
        tensors.clear()
        result = {
            "complete": complete,
            "seconds": round(time.perf_counter() - self.started, 4),
            "objects": objects,
            "tensors": len(targets),
            "visited": len(self.objects),
            "blocks": {str(b): o for b, o in found.items()},
        }
        self.objects.clear()
        self.parent.clear()
        return result

    def add_roots(self, queue):
        """Live frames' locals, then modules' globals."""
        frames = []
        for frame in sys._current_frames().values():
            while frame is not None:
                frames.append(frame)
                frame = frame.f_back
        library = _library_folders()
        for frame in frames:
            file = frame.f_code.co_filename
            if id(frame) in self.skip or file.startswith(_OURS) or file.startswith(library):
                continue
            if frame.f_code.co_name == "<module>":
                continue  # a module's body: its locals are its globals
            code = frame.f_code
            where = f"{code.co_name} ({os.path.basename(code.co_filename)}:{frame.f_lineno})"
            for name, value in list(frame.f_locals.items()):
                self.root(queue, value, f"{where}: {name}", "local")
        for name, module in list(sys.modules.items()):
            if module is None or name.startswith(("snapdiff", "_pytest", "pytest", "pluggy")):
                continue
            try:
                items = list(vars(module).items())
            except TypeError:
                continue
            if name == "__main__":
                # The script, as its file's name: `train.history`.
                path = getattr(module, "__file__", None) or "__main__"
                name = os.path.splitext(os.path.basename(path))[0]
            for attr, value in items:
                if not attr.startswith("__"):
                    self.root(queue, value, f"{name}.{attr}", "global")

    def root(self, queue, value, label, kind):
        i = id(value)
        if i in self.objects:
            return
        self.objects[i] = value
        self.roots[i] = (label, kind)
        queue.append(i)

    def children(self, obj, is_node):
        if issubclass(type(obj), _LEAVES):
            return
        if type(obj) is _FUNCTION:
            for held in (obj.__closure__, obj.__defaults__, obj.__kwdefaults__):
                if held:
                    yield held, None
            return
        yield from self.referents(obj, is_node)

    def referents(self, obj, is_node):
        """(child, how it is held) pairs: the referents, and for a tensor
        with a grad_fn, its autograd graph (`is_node`: `obj` was reached as
        a node of one; only those are asked for graph attributes, which
        other objects may answer by loading code)."""
        if issubclass(type(obj), self.torch.Tensor):
            fn = obj.grad_fn
            if fn is not None:
                yield fn, ("graph", None)
        if is_node:
            try:
                for nxt, _ in obj.next_functions:
                    if nxt is not None:
                        yield nxt, ("graph", None)
                for attr in dir(obj):
                    if attr.startswith("_saved_"):
                        try:
                            saved = getattr(obj, attr)
                        except Exception:
                            continue  # freed by backward()
                        if issubclass(type(saved), self.torch.Tensor):
                            yield saved, ("saved", attr)
            except Exception:
                pass
            return
        for child in gc.get_referents(obj):
            yield child, None

    def walk(self, targets, found):
        from collections import deque

        # Objects to expand, in tiers by their size (a tier per power of
        # two of a container's length): small containers (a model's state,
        # a cache of a few thousand tensors) are looked into before a
        # dataset of a million records, so that the search ends, once every
        # block has an owner, without walking everything. Within a tier it
        # is breadth-first; paths are short, not always the shortest.
        tiers = [deque() for _ in range(64)]
        roots = deque()
        self.add_roots(roots)
        left = set(targets)
        for rid in roots:
            if rid in left:
                left.discard(rid)
                found.setdefault(targets[rid], self.describe(rid))
        for rid in roots:
            tiers[_tier(self.objects[rid])].append(rid)
        # The search goes on while some block has no owner: blocks no
        # Python tensor lies in may still be a graph's saved tensors (which
        # get a Python object only when asked for). It stops once every
        # block has one, whatever other tensors share them (views).
        unowned = len(self.starts) - len(found)
        steps = 0
        lowest = 0
        while unowned > 0:
            while lowest < len(tiers) and not tiers[lowest]:
                lowest += 1
            if lowest == len(tiers):
                break
            steps += 1
            if steps % 2048 == 0 and time.perf_counter() > self.deadline:
                return False
            pid = tiers[lowest].popleft()
            parent = self.objects[pid]
            how_reached = self.parent.get(pid, (None, None))[1]
            is_node = how_reached is not None and how_reached[0] == "graph"
            for child, how in self.children(parent, is_node):
                cid = id(child)
                # Objects the collector does not track (numbers, strings,
                # containers of only those) hold no tensor.
                if cid in self.objects or not gc.is_tracked(child):
                    continue
                self.objects[cid] = child
                self.parent[cid] = (pid, how)
                block = None
                if cid in left:
                    left.discard(cid)
                    block = targets[cid]
                elif how is not None and how[0] == "saved":
                    block = self.block_of(child)
                if block is not None and block not in found:
                    found[block] = self.describe(cid)
                    unowned -= 1
                if how is not None and how[0] == "graph":
                    # A graph is followed before the rest of the heap: its
                    # nodes are few, and a long one would else be reached
                    # only after everything shallower.
                    tiers[0].appendleft(cid)
                    lowest = 0
                else:
                    tier = _tier(child)
                    tiers[tier].append(cid)
                    lowest = min(lowest, tier)
        return True

    def describe(self, cid):
        """The path from a root to object `cid`, in words."""
        hops = []
        graph_root = graph_group = None
        node = cid
        while node in self.parent:
            pid, how = self.parent[node]
            hops.append((pid, node, how))
            node = pid
        hops.reverse()
        label, kind = self.roots[node]
        parts = [label]
        container = None
        group = label
        for i, (pid, child_id, how) in enumerate(hops):
            parent, child = self.objects[pid], self.objects[child_id]
            if how is not None and how[0] in ("graph", "saved"):
                if graph_root is None:
                    graph_root = "".join(parts)
                    # Graphs of a container's elements are one owner.
                    if container:
                        graph_group = f"{group} (a {container})"
                    else:
                        graph_group = graph_root
                continue
            if graph_root is not None:
                continue
            step, container_type = _hop(parent, child, hops[i - 1] if i else None, self.objects)
            if step is None:
                continue
            if container_type is not None:
                group = "".join(parts)
                container = container_type
            parts.append(step)
        if graph_root is not None:
            return {
                "owner": f"the autograd graph of {graph_root}",
                "group": f"the autograd graph of {graph_group}",
                "container": None,
                "kind": "autograd",
                "via_graph": graph_root,
            }
        owner = "".join(parts)
        return {
            "owner": owner,
            "group": group if container else owner,
            "container": container,
            "kind": kind,
        }


_SIZED = (list, tuple, dict, set, frozenset)


def _tier(obj):
    """The tier an object is expanded in: by its length, for the built-in
    containers; 1 for anything else."""
    if type(obj) in _SIZED:
        return min(len(obj).bit_length(), 63)
    return 1


def _hop(parent, child, previous, objects):
    """How `parent` holds `child`, as text to append to the path, and the
    container's type name when it is an element of one (else None). An
    object's `__dict__` is written as attributes of the object."""
    if isinstance(parent, dict):
        owner_obj = objects.get(previous[0]) if previous else None
        is_attrs = owner_obj is not None and getattr(owner_obj, "__dict__", None) is parent
        for k, v in parent.items():
            if v is child:
                if is_attrs and isinstance(k, str):
                    return f".{k}", None
                return f"[{_short(k)}]", "dict"
            if k is child:
                return f" key {_short(k)}", "dict"
        return None, None
    if isinstance(parent, (list, tuple)):
        for i, v in enumerate(parent):
            if v is child:
                if type(parent).__name__ == "tuple" and previous is not None:
                    holder = objects.get(previous[0])
                    if getattr(holder, "__closure__", None) is parent:
                        names = holder.__code__.co_freevars
                        return (f" closure `{names[i]}`" if i < len(names) else None), None
                return f"[{i}]", type(parent).__name__
        return None, None
    if isinstance(parent, (set, frozenset)):
        return " element", type(parent).__name__
    if type(parent).__name__ == "cell":
        return None, None  # named by the closure above it
    attrs = getattr(parent, "__dict__", None)
    if attrs is child:
        return None, None  # attributes follow
    if isinstance(attrs, dict):
        # Python 3.11+ objects hold their attributes' values directly.
        for k, v in attrs.items():
            if v is child:
                return f".{k}", None
    name = type(parent).__name__
    if name == "functools._lru_cache_wrapper" or type(parent).__qualname__ == "_lru_cache_wrapper":
        return " (lru_cache)", "lru_cache"
    if type(child).__name__ == "function" and name in ("method",):
        return None, None
    return f".<{name}>", None


_PLAIN_KEYS = (str, bytes, int, float, bool, type(None))


def _short(key):
    """A dict key as a path writes it: plain values by their repr, a tensor
    by its type and shape (`<Parameter 512x512>`: an optimizer's state is
    keyed by parameters, whose repr formats every value), anything else by
    its type. Never a repr of user code, which may be slow or raise."""
    if type(key) in _PLAIN_KEYS or (
        type(key) is tuple and all(type(k) in _PLAIN_KEYS for k in key)
    ):
        text = repr(key)
    else:
        try:  # a user's `shape` property may raise too
            shape = getattr(key, "shape", None) if hasattr(type(key), "shape") else None
            dims = "x".join(str(int(d)) for d in shape) if shape is not None else None
        except Exception:
            dims = None
        text = f"<{type(key).__name__} {dims}>" if dims else f"<{type(key).__name__}>"
    return text if len(text) <= 40 else text[:37] + "..."
