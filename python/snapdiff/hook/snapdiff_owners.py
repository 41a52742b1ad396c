"""Who keeps a block of memory alive: the live tensors whose storage lies
in it, and a short path of references from a root of the program to each,
written as the user would write it (`train.history[13]`,
`evaluate (train.py:88): total_loss`).

The roots are the user's first: the local variables of running frames of
user code, `__main__` and the modules outside every library folder; then
the globals of every other module. From them the search walks the heap
through `gc.get_referents` only, smallest containers first, and ends as
soon as every block a tensor lies in has an owner: a dataset of a million
records is looked into last, usually never.

A tensor saved for backward is reached through the autograd graph of a
live tensor (its `grad_fn`, the nodes' `next_functions` and saved
tensors). A tensor no root reaches is in a reference cycle (the garbage
collector would free it) or held where the search cannot see (C++ code, a
numpy object array: "held, path unknown"); a block
no tensor lies in is the allocator's or C++ code's.

What it never does to the job: keep anything once it returns, run the
job's code (no property, `__getattr__`, `__iter__`, `__repr__`, `__eq__`,
`__hash__` or `__torch_function__` of the job's objects is called), store
a dict of a frame's locals on the frame (`frame.f_locals` does, on Python
3.11 and 3.12), raise, or run past its time budget
(`SNAPDIFF_OWNERS_BUDGET` seconds, 1 by default). An object it cannot
look into is skipped and counted.
"""

import bisect
import ctypes
import gc
import os
import site
import sys
import sysconfig
import time
import types

BUDGET_S = 1.0
# The search's own frames, and snapdiff's (the package around the hook,
# when it is installed), are not roots.
_HOOK = os.path.dirname(os.path.abspath(__file__))
_PACKAGE = os.path.dirname(_HOOK)
_OURS = (os.path.join(_HOOK, ""),) + (
    (os.path.join(_PACKAGE, ""),) if os.path.basename(_PACKAGE) == "snapdiff" else ()
)
# Modules whose globals are not roots: snapdiff's and the test runner's.
_NOT_ROOTS = ("snapdiff", "_pytest", "pytest", "pluggy")
# Objects not looked into: their references lead to no step's data, or
# only back to a module (already a root). Functions are looked into their
# closures and defaults only, classes into their attributes only.
_LEAVES = (
    types.ModuleType,
    types.CodeType,
    types.FrameType,
    types.MethodDescriptorType,
    types.GetSetDescriptorType,
    types.MemberDescriptorType,
    types.WrapperDescriptorType,
    type(int.real),
)
_SIZED = (list, tuple, dict, set, frozenset)
_PLAIN_KEYS = (str, int, float, bool, type(None))
# What `_hop` says of a bound method's object (`log = store.append`).
_BOUND = "bound method"
# How often (objects looked into, or children of one) the clock is read.
_CLOCK_EVERY = 256
# The most tensors, and objects, looked at for a reference cycle before
# the globals of every library are walked.
_MOST_CYCLE_TENSORS = 64
_MOST_CYCLE_OBJECTS = 512
_REFERRERS_AT_ONCE = 16
# The tier of containers of 1,024 elements and more: before looking into
# them, the search looks for cycles.
_LARGE_TIER = 11
# A path longer than the first and last steps kept is cut in the middle.
_FIRST_HOPS, _LAST_HOPS = 6, 9
# The containers on a path a report may group blocks by: the innermost.
_MOST_GROUPS = 8

_CYCLE = {
    "owner": "a reference cycle: gc would free it",
    "group": "a reference cycle: gc would free it",
    "container": None,
    "kind": "cycle",
}
# Something refers to the tensor that Python's objects do not show: C++
# code, or a container that hides its references from the collector (a
# numpy array of objects). Which one is not known, so it is not named.
_HELD_UNSEEN = "held, path unknown (by C++ code, or a container that hides what it holds, such as a numpy object array)"
_NATIVE = {
    "owner": _HELD_UNSEEN,
    "group": _HELD_UNSEEN,
    "container": None,
    "kind": "native",
}

# Attribute lookups that run no code of the object's class: the
# descriptors of `type` and `object` themselves, called directly.
_type_dict = type.__dict__["__dict__"].__get__
_type_mro = type.__dict__["__mro__"].__get__
_type_name = type.__dict__["__name__"].__get__
_type_subclasses = type.__dict__["__subclasses__"]
_module_dict = types.ModuleType.__dict__["__dict__"].__get__
_function_closure = types.FunctionType.__dict__["__closure__"].__get__
_function_defaults = types.FunctionType.__dict__["__defaults__"].__get__
_function_kwdefaults = types.FunctionType.__dict__["__kwdefaults__"].__get__
_function_attributes = types.FunctionType.__dict__["__dict__"].__get__
_method_self = types.MethodType.__dict__["__self__"].__get__
_builtin_self = types.BuiltinMethodType.__dict__["__self__"].__get__
_function_code = types.FunctionType.__dict__["__code__"].__get__


def budget():
    """The time budget in seconds, from the environment."""
    try:
        value = float(os.environ.get("SNAPDIFF_OWNERS_BUDGET") or BUDGET_S)
        return value if value > 0 else BUDGET_S
    except ValueError:
        return BUDGET_S


def find(torch, blocks, seconds=None, skip=()):
    """Owners of `blocks`, a list of (address, size) of live blocks:
    `{"complete", "seconds", "objects", "tensors", "visited", "skipped",
    "frames", "blocks": {address: owner}}`, each owner a dict of `owner`
    (the path), `group` (the container, for grouping), `container` (its
    type), `kind` (`local`, `global`, `autograd`, `cycle`, `native`), and
    `via_graph` (the graph's root, for `autograd`). Blocks no tensor lies
    in are left out. Never raises: an error is returned as
    `{"error": ...}`. `skip`: frames not to take as roots (the caller's)."""
    enabled = gc.isenabled()
    gc.disable()
    search = None
    try:
        search = _Search(torch, blocks, seconds or budget(), skip)
        # No subclass's __torch_function__ runs for what the search asks
        # of tensors (their storage, their grad_fn).
        with torch._C.DisableTorchFunctionSubclass():
            return search.run()
    except Exception as e:  # never into the job
        return {"error": f"{type(e).__name__}: {e}", "blocks": {}}
    finally:
        if search is not None:
            search.forget()
        if enabled:
            gc.enable()


class _OutOfTime(Exception):
    """The search's budget is spent."""


class _Search:
    def __init__(self, torch, blocks, seconds, skip):
        self.torch = torch
        self.tensor_base = getattr(torch._C, "TensorBase", None) or torch._C._TensorBase
        self.starts = sorted(a for a, _ in blocks)
        self.sizes = dict(blocks)
        self.started = time.perf_counter()
        self.deadline = self.started + seconds
        self.skip = {id(f) for f in skip}
        # id -> object for everything met (so that ids stay valid); id ->
        # the id of the object it was met in; and, for the objects met in
        # an autograd graph, how: ("graph",) for a node, ("saved", name)
        # for a tensor a node saved.
        self.objects = {}
        self.parent = {}
        self.how = {}
        self.roots = {}  # id -> (label, kind)
        self.tensors = {}  # id -> (tensor, its block) for the heap's tensors
        self.tensor_types = set()
        self.found = {}  # block -> owner, or the id of the object that owns it
        # What the names are made of: each object's path, each path's
        # text, how each holder holds its children.
        self.paths = {}
        self.texts = {}
        self.hops = {}
        self.skipped = 0
        self.frames = "read"

    def forget(self):
        """Drops every reference the search took."""
        for held in (self.objects, self.parent, self.how, self.roots, self.tensors, self.paths,
                     self.hops):
            held.clear()

    def out_of_time(self):
        if time.perf_counter() > self.deadline:
            raise _OutOfTime

    def run(self):
        complete = True
        objects = None
        try:
            wanted = self.list_tensors()  # the blocks a walk can reach
            library = _library_folders()
            # The user's roots (and library code's running frames, after
            # them); then, for what they do not reach, the globals of every
            # other module.
            self.walk(self.user_roots(library), wanted, self.frame_roots(library, mine=False))
            if not wanted <= self.found.keys():
                self.tell_cycles(wanted)
            if not wanted <= self.found.keys():
                self.walk(self.library_globals(library), wanted)
            if not wanted <= self.found.keys():
                everything = gc.get_objects()
                objects = len(everything)
                self.tell_unreached(everything, wanted)
                del everything
        except _OutOfTime:
            complete = False
        described = {}
        for n, (block, owner) in enumerate(self.found.items()):
            if type(owner) is int:
                try:
                    if n % _CLOCK_EVERY == 0:
                        self.out_of_time()
                    owner = self.describe(owner)
                except _OutOfTime:
                    complete = False
                    break
            described[str(block)] = owner
        return {
            "complete": complete,
            "seconds": round(time.perf_counter() - self.started, 4),
            "objects": objects,  # listed only to tell cycles apart
            "tensors": len(self.tensors),
            "visited": len(self.objects),
            "skipped": self.skipped,
            "frames": self.frames,
            "blocks": described,
        }

    # --- the heap's tensors ------------------------------------------------

    def block_of(self, tensor):
        """The address of the block the tensor's storage lies in, if any
        (asked of PyTorch's own method)."""
        try:
            ptr = self.tensor_base.untyped_storage(tensor).data_ptr()
        except Exception:
            self.skipped += 1
            return None
        i = bisect.bisect_right(self.starts, ptr) - 1
        if i >= 0 and ptr < self.starts[i] + self.sizes[self.starts[i]]:
            return self.starts[i]
        return None

    def list_tensors(self):
        """Finds the tensors in the heap whose storage lies in a block, and
        the tensors their autograd graphs save: the blocks a walk can
        reach (the rest are C++ code's or the cache's). A tensor refers to
        its class, so the tensors are what refers to a tensor class (one
        pass over the heap, in C)."""
        tensor_types = self.tensor_types
        classes = [self.tensor_base]
        while classes:
            for sub in _type_subclasses(classes.pop()):
                if sub not in tensor_types:
                    tensor_types.add(sub)
                    classes.append(sub)
        wanted = set()
        nodes = {}
        for o in gc.get_referrers(*tensor_types):
            if type(o) not in tensor_types:
                continue
            block = self.block_of(o)
            if block is not None:
                self.tensors[id(o)] = (o, block)
                wanted.add(block)
            fn = self.grad_fn(o)
            if fn is not None:
                nodes[id(fn)] = fn
        # Every graph once: the blocks its nodes save.
        seen = set(nodes)
        queue = list(nodes.values())
        while queue:
            node = queue.pop()
            for child, how in self.graph_children(node):
                if how[0] == "saved":
                    block = self.block_of(child)
                    if block is not None:
                        wanted.add(block)
                elif id(child) not in seen:
                    seen.add(id(child))
                    queue.append(child)
            if len(seen) % _CLOCK_EVERY == 0:
                self.out_of_time_before_walk()
        return wanted

    def out_of_time_before_walk(self):
        # The listing has its own share: at most half the budget.
        if time.perf_counter() > self.started + (self.deadline - self.started) / 2:
            raise _OutOfTime

    def grad_fn(self, tensor):
        try:
            return self.tensor_base.grad_fn.__get__(tensor)
        except Exception:
            return None

    def grad(self, tensor):
        """The tensor's `.grad` (held by PyTorch, not by a Python object)."""
        try:
            return self.tensor_base._grad.__get__(tensor)
        except Exception:
            return None

    def graph_children(self, node):
        """(child, how) of an autograd node: the next nodes, and the
        tensors it saved for backward (PyTorch's own attributes of its
        node classes; a graph whose backward ran has none left)."""
        try:
            for nxt, _ in node.next_functions:
                if nxt is not None:
                    yield nxt, ("graph",)
        except Exception:
            self.skipped += 1
            return
        for attr in _saved_attributes(type(node)):
            try:
                saved = getattr(node, attr)
            except Exception:
                continue  # freed by backward()
            if self.tensor_base in _type_mro(type(saved)):
                yield saved, ("saved", attr)

    # --- the roots -----------------------------------------------------------

    def user_roots(self, library):
        """(object, label, kind) of the user's code: the local variables of
        running frames of user code, the globals of `__main__` and of the
        modules outside library folders."""
        yield from self.frame_roots(library, mine=True)
        yield from self.module_roots(library, mine=True)

    def library_globals(self, library):
        yield from self.module_roots(library, mine=False)

    def frame_roots(self, library, mine):
        for frame in self.running_frames():
            code = frame.f_code
            file = code.co_filename
            if id(frame) in self.skip:
                continue
            if code.co_name == "<module>" or _in(file, library) == mine:
                continue  # a module's body: its locals are its globals
            variables = _frame_locals(frame)
            if variables is None:
                self.frames = f"not read (Python {sys.version_info[0]}.{sys.version_info[1]})"
                continue
            where = f"{code.co_name} ({os.path.basename(file)}:{frame.f_lineno})"
            for name, value in variables:
                yield value, f"{where}: {name}", "local"

    def module_roots(self, library, mine):
        modules = sys.modules
        for name, module in list(dict.items(modules) if type(modules) is dict else ()):
            if type(name) is not str or name.startswith(_NOT_ROOTS):
                continue
            try:
                attrs = _module_dict(module)
            except Exception:  # not a module
                continue
            if type(attrs) is not dict:
                continue
            file = attrs.get("__file__")
            users = name == "__main__" or (
                type(file) is str and not file.startswith(_OURS) and not _in(file, library)
            )
            if users != mine:
                continue
            if name == "__main__":
                # The script, as its file's name: `train.history`.
                stem = file if type(file) is str else "__main__"
                name = os.path.splitext(os.path.basename(stem))[0]
            for attr, value in list(dict.items(attrs)):
                if type(attr) is str and not attr.startswith("__"):
                    yield value, f"{name}.{attr}", "global"

    def running_frames(self):
        """The running frames of every thread, but the search's own and
        snapdiff's. None of them may be kept: a frame of the search holding
        a list of frames that holds it is a reference cycle, which keeps
        every frame in it, and what they hold once they return (a step's
        batch), until the collector runs."""
        for top in sys._current_frames().values():
            frame, top = top, None
            while frame is not None:
                if not frame.f_code.co_filename.startswith(_OURS):
                    yield frame
                frame = frame.f_back

    # --- the walk --------------------------------------------------------------

    def walk(self, roots, wanted, later=()):
        """Looks into the heap from `roots` until every block of `wanted`
        has an owner or nothing is left to look into. Objects are looked
        into in tiers by size (a tier per power of two of a container's
        length), small first: a model's state, a cache of a few thousand
        tensors, before a dataset of a million records; breadth-first
        within a tier, so paths are short, not always the shortest. The
        roots of `later` (library code's frames) are taken only before the
        large containers, once the rest named what it could."""
        from collections import deque

        tiers = [deque() for _ in range(64)]
        self.unowned = len(wanted - self.found.keys())
        self.add_roots(roots, tiers, wanted)
        lowest = 0
        steps = 0
        looked_for_cycles = False
        while self.unowned > 0:
            while lowest < len(tiers) and not tiers[lowest]:
                lowest += 1
            if later is not None and (lowest == len(tiers) or lowest >= _LARGE_TIER):
                self.add_roots(later, tiers, wanted)
                later = None
                lowest = 0
                continue
            if lowest == len(tiers):
                return
            if lowest >= _LARGE_TIER and not looked_for_cycles:
                # Before the large containers (a dataset): are the few
                # tensors left in reference cycles, which no walk reaches?
                looked_for_cycles = True
                self.tell_cycles(wanted)
                self.unowned = len(wanted - self.found.keys())
                continue
            steps += 1
            if steps % _CLOCK_EVERY == 0:
                self.out_of_time()
            pid = tiers[lowest].popleft()
            for child, how in self.children(self.objects[pid], pid):
                cid = id(child)
                if cid in self.objects:
                    continue
                self.objects[cid] = child
                self.parent[cid] = pid
                if how is not None:
                    self.how[cid] = how
                self.met(cid, child, how, wanted)
                if how is not None:
                    # A graph is followed before the rest of the heap: its
                    # nodes are few, and a long one would else be reached
                    # only after everything shallower.
                    tiers[0].appendleft(cid)
                    lowest = 0
                else:
                    tier = _tier(child)
                    tiers[tier].append(cid)
                    lowest = min(lowest, tier)

    def add_roots(self, roots, tiers, wanted):
        for value, label, kind in roots:
            i = id(value)
            if i in self.objects:
                continue
            self.objects[i] = value
            self.roots[i] = (label, kind)
            self.met(i, value, None, wanted)
            tiers[_tier(value)].append(i)

    def met(self, oid, obj, how, wanted):
        """Gives the block of a tensor met for the first time its owner."""
        if oid in self.tensors:
            block = self.tensors[oid][1]
        elif how is not None and how[0] == "saved":
            block = self.block_of(obj)
        else:
            return
        if block is not None and block in wanted and block not in self.found:
            self.found[block] = oid  # described once the walk ends
            self.unowned -= 1

    def children(self, obj, oid):
        """(child, how) pairs: what `obj` refers to that may hold a tensor
        (objects the garbage collector tracks), and for a tensor with a
        `grad_fn` its autograd graph."""
        kind = type(obj)
        how = self.how.get(oid)
        if how is not None:
            if how[0] == "graph":  # a node; a saved tensor holds no more
                yield from self.graph_children(obj)
            return
        if issubclass(kind, _LEAVES):
            return
        if kind is types.FunctionType:
            # Its closure, defaults and attributes; not its module's
            # globals (roots already).
            referents = [
                _function_closure(obj),
                _function_defaults(obj),
                _function_kwdefaults(obj),
                _function_attributes(obj),
            ]
        elif issubclass(kind, type):
            referents = [_type_dict(obj)]  # a class: its attributes
        else:
            referents = gc.get_referents(obj)
        if kind in self.tensor_types:
            fn = self.grad_fn(obj)
            if fn is not None:
                yield fn, ("graph",)
            else:  # a leaf's gradient (a non-leaf's would warn)
                grad = self.grad(obj)
                if grad is not None:
                    yield grad, None
        tracked = gc.is_tracked
        for n, child in enumerate(referents):
            if n % _CLOCK_EVERY == _CLOCK_EVERY - 1:
                self.out_of_time()
            if type(child) is types.MappingProxyType:
                child = gc.get_referents(child)[0]  # a class's attribute dict
            if child is not None and tracked(child):
                yield child, None

    # --- what is left --------------------------------------------------------

    def tell_cycles(self, wanted):
        """Of the few tensors left without an owner (at most
        `_MOST_CYCLE_TENSORS`), those in a small group of objects that
        nothing outside the group refers to (a reference cycle: garbage),
        or that something outside Python holds; found from their
        referrers, up to `_MOST_CYCLE_OBJECTS` objects. Tensors something
        else refers to are left to the walk."""
        left = [
            (oid, pair[0]) for oid, pair in self.tensors.items()
            if pair[1] in wanted and pair[1] not in self.found
        ]
        if not left or len(left) > _MOST_CYCLE_TENSORS:
            return
        group = dict(left)
        frontier = [t for _, t in left]
        del left
        skip = {id(group), id(frontier)} | {id(pair) for pair in self.tensors.values()}
        while frontier:
            self.out_of_time()
            if not self.add_referrers(group, frontier, skip):
                return  # reached otherwise, or too large to tell: the walk goes on
        self.tell_apart(group, wanted, searchs_references=2)  # `group`, getrefcount's argument

    def add_referrers(self, group, frontier, skip):
        """Adds to `group` what refers to the objects of `frontier`, which
        it then holds instead; False when one was reached otherwise or the
        group grew too large. (A function of its own, so that no variable
        of the search still refers to one of them when they are counted.)"""
        added = []
        # A few at a time: each call scans the heap, comparing every
        # reference with each object asked about.
        for start in range(0, len(frontier), _REFERRERS_AT_ONCE):
            self.out_of_time()
            chunk = frontier[start : start + _REFERRERS_AT_ONCE]
            skip.add(id(chunk))
            for r in gc.get_referrers(*chunk):
                rid = id(r)
                if rid in group or rid in skip:
                    continue
                if rid in self.objects or type(r) is types.ModuleType:
                    return False
                if len(group) >= _MOST_CYCLE_OBJECTS:
                    return False
                group[rid] = r
                added.append(r)
            del chunk
        frontier[:] = added
        return True

    def tell_apart(self, group, wanted, searchs_references):
        """Names the owner of the tensors in `group` (id -> object), a set
        of objects nothing outside it refers to through the heap: the
        group's objects that more refer to than the group's own references
        (and the search's: `searchs_references`, one more for a tensor, in
        `self.tensors`) are held from outside Python, and with them what
        they refer to; the rest is garbage, a reference cycle."""
        inside = self.references_inside(group)
        alive = []
        for oid in list(group):
            ours = searchs_references + (oid in self.tensors)
            if sys.getrefcount(group[oid]) - ours > inside[oid]:
                alive.append(oid)
        held = set(alive)
        while alive:
            self.out_of_time()
            for r in gc.get_referents(group[alive.pop()]):
                if id(r) in group and id(r) not in held:
                    held.add(id(r))
                    alive.append(id(r))
        for oid, (_, block) in self.tensors.items():
            if oid in group and block in wanted and block not in self.found:
                self.found[block] = _NATIVE if oid in held else _CYCLE

    def references_inside(self, group):
        """How many references each object of `group` gets from the group."""
        inside = dict.fromkeys(group, 0)
        for n, o in enumerate(list(group.values())):
            if n % _CLOCK_EVERY == 0:
                self.out_of_time()
            for r in gc.get_referents(o):
                if id(r) in inside:
                    inside[id(r)] += 1
        return inside

    def tell_unreached(self, everything, wanted):
        """The tensors of blocks still without an owner were reached from
        no root: each is in a reference cycle (garbage) or held from
        outside Python, told apart among all the objects no root reaches."""
        ours = {id(self), id(self.__dict__)} | {id(v) for v in self.__dict__.values()}
        ours.update(id(pair) for pair in self.tensors.values())
        unreached = {
            id(o): o for o in everything if id(o) not in self.objects and id(o) not in ours
        }
        # `everything`, `unreached`, getrefcount's argument.
        self.tell_apart(unreached, wanted, searchs_references=3)
        unreached.clear()

    # --- names ---------------------------------------------------------------

    def describe(self, oid):
        """The owner of object `oid`: its path from a root, in words."""
        try:
            path = self.path(oid)
        except _OutOfTime:
            raise
        except Exception:
            self.skipped += 1
            while oid in self.parent:
                oid = self.parent[oid]
            label, kind = self.roots.get(oid, ("an object", "global"))
            return {"owner": label, "group": label, "container": None, "kind": kind}
        if path.graph is not None:
            root, group = path.graph
            return {
                "owner": f"the autograd graph of {root}",
                "group": f"the autograd graph of {group}",
                "container": None,
                "kind": "autograd",
                "via_graph": root,
            }
        owner = self.text(path)
        if path.bound is not None:
            group = path.bound
        elif path.container is not None:
            group = self.text(path.group_at)
        else:
            group = owner
        # Every container on the way, outermost first: a report groups a
        # line's blocks by the deepest one that holds several of them
        # (`optimizer.param_groups` for `param_groups[2]['params'][0]`).
        groups = []
        boundary = path.boundaries
        while boundary is not None and len(groups) < _MOST_GROUPS:
            at, container, boundary = boundary
            groups.append([at if type(at) is str else self.text(at), container])
        groups.reverse()
        return {
            "owner": owner,
            "group": group,
            "container": path.container,
            "kind": path.kind,
            "groups": groups,
        }

    def path(self, oid):
        """The `_Path` of object `oid`, made from its parent's (kept: the
        owners of a list's thousand tensors share all but the last step)."""
        chain = []
        node = oid
        while node not in self.paths:
            if node not in self.parent:
                label, kind = self.roots[node]
                self.paths[node] = _Path(None, label, kind)
                break
            chain.append(node)
            node = self.parent[node]
        for n, node in enumerate(reversed(chain)):
            if n % _CLOCK_EVERY == _CLOCK_EVERY - 1:
                self.out_of_time()
            pid, how = self.parent[node], self.how.get(node)
            self.paths[node] = self.step(self.paths[pid], pid, node, how)
        return self.paths[oid]

    def step(self, before, pid, cid, how):
        """The path to `cid`, one step on from `before`, the path to its
        holder `pid`."""
        if before.graph is not None:
            return before  # inside a graph, all is the graph's
        if how is not None:
            # Into an autograd graph: the graph of the tensor so far; the
            # graphs of a container's elements are one owner.
            root = self.text(before)
            group = (
                f"{self.text(before.group_at)} (a {before.container})"
                if before.container is not None else root
            )
            return before.into_graph((root, group))
        text, container = self.hop_index(pid).get(cid, (None, None))
        if text is None:
            return before
        if container == _BOUND:
            # `train.log (a bound method of a list)`: the method is what
            # the user holds; its object, what it keeps.
            bound = f"{self.text(before)} (a bound method of a {_type_name(type(self.objects[cid]))})"
            path = _Path(before, text, before.kind, bound=bound)
            path.boundaries = (bound, None, before.boundaries)
            return path
        if container is not None and before.bound is None:
            # Blocks are grouped by the largest container on the way (the
            # innermost of equals): `app.cache` for `app.cache['k7']['value']`.
            size = _size(self.objects[pid])
            if before.container is None or size >= before.size:
                path = _Path(before, text, before.kind, before, container, size=size)
            else:
                path = _Path(before, text, before.kind, before.group_at, before.container,
                             size=before.size)
            path.boundaries = (before, container, before.boundaries)
            return path
        path = _Path(
            before, text, before.kind, before.group_at, before.container, before.bound, before.size
        )
        path.boundaries = before.boundaries
        return path

    def hop_index(self, pid):
        """How object `pid` holds each of its children: `{id: (text,
        container type or None)}`, made once per holder."""
        index = self.hops.get(pid)
        if index is None:
            parent = self.objects[pid]
            holder_id = self.parent.get(pid)
            holder = self.objects.get(holder_id) if holder_id is not None else None
            index = self.hops[pid] = _hops(parent, holder, self.key_text)
            if type(parent) in self.tensor_types and self.grad_fn(parent) is None:
                grad = self.grad(parent)
                if grad is not None:
                    index[id(grad)] = (".grad", None)
        return index

    def key_text(self, key):
        """A dict key in a path: `_key`, and a tensor by its class and shape
        (`<Parameter 512x512>`: an optimizer's state is keyed by them)."""
        if type(key) in self.tensor_types:
            try:
                shape = self.tensor_base.shape.__get__(key)
                return f"<{_type_name(type(key))} {'x'.join(str(int(d)) for d in shape)}>"
            except Exception:
                pass
        return _key(key)

    def text(self, path):
        """A path in words (`train.state.previous[3]`), long ones cut in
        the middle."""
        text = self.texts.get(id(path))
        if text is None:
            # The last steps, walked back; the first, kept on the path.
            tail = []
            p = path
            while p is not None and len(tail) < _LAST_HOPS:
                tail.append(p.text)
                p = p.before
            tail.reverse()
            if path.depth <= _FIRST_HOPS + _LAST_HOPS:
                steps = list(path.head[: path.depth - len(tail)]) + tail
            else:
                steps = list(path.head) + ["..."] + tail
            text = self.texts[id(path)] = "".join(steps)
        return text


class _Path:
    """A path from a root, one step at a time: its last step's text, the
    path before it, what kind of root it starts at, and the container its
    object is an element of (the owner blocks are grouped by)."""

    __slots__ = (
        "before", "text", "kind", "group_at", "container", "bound", "size", "graph", "boundaries",
        "depth", "head",
    )

    def __init__(self, before, text, kind, group_at=None, container=None, bound=None, size=0):
        self.before = before
        self.depth = 1 if before is None else before.depth + 1
        # The first steps' texts (what a long path's text starts with).
        if before is None:
            self.head = (text,)
        elif before.depth < _FIRST_HOPS:
            self.head = before.head + (text,)
        else:
            self.head = before.head
        self.size = size  # the container's length
        self.text = text
        self.kind = kind
        self.group_at = group_at  # the path of the container
        self.container = container  # its type's name
        self.bound = bound  # the group, for a bound method's object
        self.graph = None  # (graph's root, its group), inside a graph
        # (the path to a container or a group's text, the container's
        # type, the boundaries before it): every container on the way.
        self.boundaries = None

    def into_graph(self, graph):
        path = _Path(self.before, self.text, self.kind)
        path.graph = graph
        return path


def _size(obj):
    """A built-in container's length (0 for anything else)."""
    for kind in _SIZED:
        if issubclass(type(obj), kind):
            return kind.__len__(obj)
    return 0


def _tier(obj):
    """The tier an object is looked into in: by its length, for the
    built-in containers; 1 for anything else."""
    if type(obj) in _SIZED:
        return min(len(obj).bit_length(), 63)
    return 1


_SAVED = {}


def _saved_attributes(node_type):
    """The `_saved_*` attributes of an autograd node class (PyTorch's)."""
    names = _SAVED.get(node_type)
    if names is None:
        names = _SAVED[node_type] = tuple(
            n for n in _type_dict(node_type) if type(n) is str and n.startswith("_saved_")
        )
    return names


def _in(file, folders):
    return file.startswith(folders) or file.startswith("<frozen ")


_LIBRARY_FOLDERS = {}


def _library_folders():
    """`_find_library_folders()`, kept while `sys.path` and the working
    folder stay the same (each dump asks)."""
    try:
        key = (tuple(p for p in sys.path if type(p) is str), os.getcwd())
    except OSError:
        key = None
    if key not in _LIBRARY_FOLDERS:
        _LIBRARY_FOLDERS.clear()
        _LIBRARY_FOLDERS[key] = _find_library_folders()
    return _LIBRARY_FOLDERS[key]


def _find_library_folders():
    """Where installed packages and the standard library live: their
    frames (torch's optimizer wrapper, pytest's runner) are not roots, and
    their modules' globals come after the user's. Every site folder, the
    interpreter's own, and the folders `.pth` files add, except one
    holding the job's script or working directory (an editable install of
    the user's project)."""
    folders = set()
    try:
        sites = list(site.getsitepackages()) + [site.getusersitepackages()]
    except Exception:
        sites = []
    sites += [p for p in sys.path if os.path.basename(p) in ("site-packages", "dist-packages")]
    folders.update(sites)
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        try:
            folders.add(sysconfig.get_path(key))
        except Exception:
            pass
    main = sys.modules.get("__main__")
    script = getattr(main, "__file__", None) if type(main) is types.ModuleType else None
    mine = [os.path.abspath(p) for p in (script, os.getcwd()) if type(p) is str]
    for folder in set(sites):
        try:
            names = [n for n in os.listdir(folder) if n.endswith(".pth")]
        except OSError:
            continue
        for name in names:
            try:
                with open(os.path.join(folder, name), encoding="utf-8", errors="replace") as f:
                    lines = f.read().splitlines()
            except OSError:
                continue
            for line in lines:
                line = line.strip()
                if not line or line.startswith(("#", "import ", "import\t")):
                    continue
                path = os.path.abspath(os.path.join(folder, line))
                if os.path.isdir(path) and not any(
                    p == path or p.startswith(os.path.join(path, "")) for p in mine
                ):
                    folders.add(path)
    return tuple(os.path.join(f, "") for f in folders if f)


# --- a running frame's local variables ------------------------------------

if sys.version_info[:2] in ((3, 11), (3, 12)):
    # The interpreter frame's layout (Include/internal/pycore_frame.h):
    # where its code and frame object pointers lie (to check the layout
    # against the frame itself), and where its local variables start.
    _CODE_AT, _FRAME_OBJECT_AT = (32, 40) if sys.version_info[:2] == (3, 11) else (0, 48)
    _LOCALS_AT = 72
    _FRAME_AT = 3 * ctypes.sizeof(ctypes.c_void_p)  # PyFrameObject.f_frame


def _pointer(address):
    return ctypes.c_void_p.from_address(address).value


def _frame_locals(frame):
    """(name, value) of a running frame's bound local variables (a
    closure's cells as what they hold), or None where they cannot be read
    without changing the frame. On Python 3.11 and 3.12 `frame.f_locals`
    stores a dict of them on the frame, keeping alive what the function
    later deletes; there they are read from the frame's slots instead, as
    profilers do, once the layout is checked against the frame's own
    pointers. On 3.13 and later `f_locals` is a view that stores nothing."""
    if sys.version_info >= (3, 13):
        try:
            return list(frame.f_locals.items())
        except Exception:
            return None
    if sys.version_info[:2] not in ((3, 11), (3, 12)):
        return None
    code = frame.f_code
    interpreter_frame = _pointer(id(frame) + _FRAME_AT)
    if (
        not interpreter_frame
        or _pointer(interpreter_frame + _CODE_AT) != id(code)
        or _pointer(interpreter_frame + _FRAME_OBJECT_AT) != id(frame)
    ):
        return None
    # The slots: the function's variables, then its cells that are not
    # arguments, then the variables it closes over.
    names = list(code.co_varnames)
    names += [n for n in code.co_cellvars if n not in code.co_varnames]
    names += list(code.co_freevars)
    cells = set(code.co_cellvars) | set(code.co_freevars)
    size = ctypes.sizeof(ctypes.c_void_p)
    variables = []
    for i, name in enumerate(names):
        address = _pointer(interpreter_frame + _LOCALS_AT + i * size)
        if not address:
            continue  # not bound (yet, or any more)
        value = ctypes.cast(address, ctypes.py_object).value
        if name in cells and type(value) is types.CellType:
            held = gc.get_referents(value)
            if not held:
                continue
            value = held[0]
        variables.append((name, value))
    return variables


# --- a step of a path, in words ---------------------------------------------


def _instance_attributes(obj):
    """An object's attribute dict, from the `__dict__` slot its class
    defines (CPython's own descriptor; a class's own `__dict__` property is
    never called), or None."""
    for klass in _type_mro(type(obj)):
        descriptor = _type_dict(klass).get("__dict__")
        if descriptor is not None:
            if type(descriptor) is types.GetSetDescriptorType:
                attrs = descriptor.__get__(obj, type(obj))
                return attrs if type(attrs) is dict else None
            return None
    return None


# The attributes in which a torch module keeps its submodules, parameters
# and buffers: a path steps through them unnamed (`model.fc.weight`).
_MODULE_MEMBER_TABLES = ("_modules", "_parameters", "_buffers")


def _is_module_member_table(attrs, table):
    """Whether dict `table` is one of `_MODULE_MEMBER_TABLES` in `attrs`,
    the attribute dict of a torch module (known by holding all three, so
    that torch need not be imported)."""
    if type(attrs) is not dict or type(table) is not dict:
        return False
    try:
        tables = [dict.get(attrs, name) for name in _MODULE_MEMBER_TABLES]
    except TypeError:
        return False
    return all(type(t) is dict for t in tables) and any(t is table for t in tables)


def _hops(parent, holder, key_text):
    """How `parent` holds each object it refers to: `{id: (text to add to
    the path, the container's type name when it is an element of one,
    else None)}`. `holder`: the object that holds `parent`. An object's
    attribute dict is written as attributes of the object."""
    kind = type(parent)
    index = {}
    if issubclass(kind, dict):
        holder_attrs = _instance_attributes(holder) if holder is not None else None
        is_attrs = holder is not None and (
            holder_attrs is parent
            or (issubclass(type(holder), type)
                and gc.get_referents(_type_dict(holder))[0] is parent)
        )
        if holder is not None and type(holder) is dict:
            holder_attrs = holder  # a module's attributes, as older Pythons hold them
        if _is_module_member_table(holder_attrs, parent):
            # A torch module's submodules, parameters and buffers, written
            # as users write them: `model.layers[3].attn`, `model.fc.weight`.
            for k, v in list(dict.items(parent)):
                if type(k) is str and k.isdigit():
                    index.setdefault(id(v), (f"[{k}]", None))
                elif type(k) is str and k.isidentifier():
                    index.setdefault(id(v), (f".{k}", None))
                else:
                    index.setdefault(id(v), (f"[{key_text(k)}]", None))
            return index
        for k, v in list(dict.items(parent)):
            if is_attrs and type(k) is str:
                index.setdefault(
                    id(v), (None if _is_module_member_table(parent, v) else f".{k}", None)
                )
            else:
                index.setdefault(id(v), (f"[{key_text(k)}]", "dict"))
            index.setdefault(id(k), (f" key {key_text(k)}", "dict"))
    elif issubclass(kind, (list, tuple)):
        items = list(list.__iter__(parent) if issubclass(kind, list) else tuple.__iter__(parent))
        if type(holder) is types.FunctionType and _function_closure(holder) is parent:
            names = _function_code(holder).co_freevars
            for i, v in enumerate(items):
                index.setdefault(id(v), (f" closure `{names[i]}`" if i < len(names) else None, None))
        else:
            name = _type_name(kind)
            for i, v in enumerate(items):
                index.setdefault(id(v), (f"[{i}]", name))
    elif issubclass(kind, (set, frozenset)):
        name = _type_name(kind)
        for v in list(set.__iter__(parent) if issubclass(kind, set) else frozenset.__iter__(parent)):
            index.setdefault(id(v), (" element", name))
    elif kind is types.MethodType or kind is types.BuiltinMethodType:
        bound = (_method_self if kind is types.MethodType else _builtin_self)(parent)
        index[id(bound)] = (".__self__", _BOUND)
    elif kind is types.CellType or kind is types.FunctionType or issubclass(kind, type):
        pass  # named by the closure; a class's attribute dict follows
    elif _type_name(kind) == "_lru_cache_wrapper":
        for v in gc.get_referents(parent):
            index.setdefault(id(v), (" (lru_cache)", None))  # its dict follows
    else:
        attrs = _instance_attributes(parent)
        if attrs is not None:
            index[id(attrs)] = (None, None)  # its attributes follow
            # Python 3.11+ objects hold their attributes' values directly.
            for k, v in list(dict.items(attrs)):
                if type(k) is str:
                    index.setdefault(
                        id(v), (None if _is_module_member_table(attrs, v) else f".{k}", None)
                    )
        for klass in _type_mro(kind):  # __slots__
            for name, descriptor in list(_type_dict(klass).items()):
                if type(descriptor) is types.MemberDescriptorType:
                    try:
                        index.setdefault(id(descriptor.__get__(parent, kind)), (f".{name}", None))
                    except AttributeError:
                        continue
        other = f".<{_type_name(kind)}>"
        for v in gc.get_referents(parent):
            index.setdefault(id(v), (other, None))
    return index


def _key(key):
    """A dict key as a path writes it: plain values (str, int, float, bool,
    None, and tuples of those) by their repr, anything else by its type
    (`<Parameter>`: an optimizer's state is keyed by parameters). Never a
    repr of the job's objects, which may be slow or raise."""
    if type(key) in _PLAIN_KEYS or (
        type(key) is tuple and all(type(k) in _PLAIN_KEYS for k in key)
    ):
        text = repr(key)
    else:
        text = f"<{_type_name(type(key))}>"
    return text if len(text) <= 40 else text[:37] + "..."
