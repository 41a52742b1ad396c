// snapdiff's CPU allocation recorder: wraps PyTorch's CPU allocator
// (`c10::SetCPUAllocator`) so that every CPU storage's allocation and free
// is noted below Python, with the Python stack of the thread that asked.
//
// Written by hand because PyTorch records memory history only for CUDA and
// offers no hook for CPU storages; a `TorchDispatchMode` sees them too, but
// puts every operator through Python (2.2-2.6x on the test model before any
// recording). `snapdiff_cpu_recorder.py` compiles this file once per torch
// and Python version (g++, as `torch.compile` needs on CPU), loads it with
// ctypes and turns what it holds into snapshot records at each dump.
//
// Locks: an allocation never waits for the GIL. PyTorch allocates with the
// GIL released and often under a lock of its own (a generator's, taken by
// `torch.multinomial`), which another thread may wait for while holding the
// GIL (`torch.get_rng_state()`): waiting for the GIL there hangs the job.
// So the stack of the thread that started recording is kept as it runs, by
// a profile function (`on_profile`, called with the GIL held at each Python
// call and return: a shadow stack of its frames), and read by that thread
// inside an allocation without the GIL: its frames cannot change while it
// is inside PyTorch. Other threads' storages are noted without frames.
// This file's two mutexes (`mu`, `stacks_mu`) are each held only briefly,
// never while waiting for the GIL or calling into Python, and never both.

#include <Python.h>
#include <frameobject.h>

#include <c10/core/CPUAllocator.h>

#include <pthread.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <ctime>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace {

// One frame of a stack: the code object (held) and the offset of the
// instruction running, which tells two calls in one function apart faster
// than the line does (the line is looked up once, at a dump).
struct Place {
  PyObject* code;
  int offset;
  bool operator==(const Place& o) const {
    return code == o.code && offset == o.offset;
  }
};

struct PlacesHash {
  size_t operator()(const std::vector<Place>& places) const {
    size_t h = 1469598103934665603ull;
    for (const Place& p : places) {
      h = (h ^ reinterpret_cast<uintptr_t>(p.code)) * 1099511628211ull;
      h = (h ^ static_cast<size_t>(p.offset)) * 1099511628211ull;
    }
    return h;
  }
};

// A storage the wrapper handed out and PyTorch has not freed. `recorded`
// is false for one made before the recording running now.
struct Live {
  size_t size;
  uint32_t stack;
  bool recorded;
  c10::DeleterFnPtr inner_deleter;  // frees it in the wrapped allocator
};

// What happened to a storage: PyTorch's trace actions, in `kActions`.
// A step marker's size is the number of optimizer steps taken before it.
enum Action : uint8_t { kAllocation, kRelease, kDumpMarker, kStepMarker };

struct Event {
  Action action;
  uintptr_t address;
  size_t size;
  int64_t time_us;
  uint32_t stack;
};

const uint32_t kNoStack = 0;  // stack 0 is the empty one

int64_t now_us() {
  timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  return static_cast<int64_t>(t.tv_sec) * 1000000 + t.tv_nsec / 1000;
}

struct State {
  std::mutex mu;  // guards the storages and events below
  std::unordered_map<void*, Live> live;
  size_t active = 0;          // bytes of the recorded live storages
  std::vector<Event> events;  // a ring of the newest `capacity`
  size_t first = 0;           // oldest event's index in the ring
  size_t capacity = 1;
  uint64_t allocations = 0;   // storages this recording noted
  std::atomic<bool> recording{false};

  std::mutex stacks_mu;  // guards the stack table
  std::unordered_map<std::vector<Place>, uint32_t, PlacesHash> stack_ids;
  std::vector<const std::vector<Place>*> stacks{nullptr};
  // Code objects of stacks added without the GIL, to be held (`hold_codes`)
  // before their frames can end; `unheld` says there are some.
  std::vector<PyObject*> codes_to_hold;
  std::atomic<bool> unheld{false};

  std::atomic<bool> stacks_on{true};
  std::atomic<unsigned long> recording_thread{0};
  // Set when another profile function replaced this file's on the
  // recording thread: its storages are noted without frames since.
  std::atomic<bool> stacks_lost{false};
  pid_t pid = 0;

  void push(const Event& e) {
    if (events.size() < capacity) {
      events.push_back(e);
    } else {
      events[first] = e;
      first = (first + 1) % capacity;
    }
  }

  // The ring, oldest first.
  std::vector<Event> ordered_events() const {
    std::vector<Event> out;
    out.reserve(events.size());
    for (size_t i = 0; i < events.size(); i++) {
      out.push_back(events[(first + i) % events.size()]);
    }
    return out;
  }
};

// Never destroyed: storages made while recording keep this file's deleter
// and allocator for as long as they live, which may be past exit.
State* state = new State();
c10::Allocator* inner = nullptr;

// One frame of the recording thread's shadow stack: the frame (held) and
// its code (held by the frame).
struct Shadow {
  PyFrameObject* frame;
  PyObject* code;
};

// The recording thread's Python frames, outermost first, kept by
// `on_profile`; only that thread reads or writes it. A pointer, never
// destroyed: a thread's exit must not release frames without the GIL.
thread_local std::vector<Shadow>* shadow = nullptr;

int on_profile(PyObject*, PyFrameObject* frame, int what, PyObject*);

// Holds the code objects of stacks added without the GIL. With the GIL.
void hold_codes() {
  if (!state->unheld.load(std::memory_order_acquire)) {
    return;
  }
  std::vector<PyObject*> codes;
  {
    std::lock_guard<std::mutex> lock(state->stacks_mu);
    codes.swap(state->codes_to_hold);
    state->unheld.store(false, std::memory_order_release);
  }
  for (PyObject* code : codes) {
    Py_INCREF(code);
  }
}

// Empties this thread's shadow stack. With the GIL.
void clear_shadow() {
  if (shadow != nullptr) {
    std::vector<Shadow> frames;
    frames.swap(*shadow);
    for (const Shadow& s : frames) {
      Py_DECREF(s.frame);
    }
  }
}

// Fills this thread's shadow stack from `innermost` (a borrowed frame, or
// null) outwards. With the GIL.
void fill_shadow(PyFrameObject* innermost) {
  clear_shadow();
  if (shadow == nullptr) {
    shadow = new std::vector<Shadow>();
  }
  Py_XINCREF(innermost);
  for (PyFrameObject* frame = innermost; frame != nullptr;) {
    PyCodeObject* code = PyFrame_GetCode(frame);
    shadow->push_back({frame, reinterpret_cast<PyObject*>(code)});  // takes `frame`
    Py_DECREF(code);  // held by the frame
    frame = PyFrame_GetBack(frame);
  }
  std::reverse(shadow->begin(), shadow->end());
}

// The profile function of the recording thread: pushes each frame entered,
// pops each one left, so that `python_stack` can read the stack without
// the GIL. Called with the GIL held; removes itself when recording ended.
int on_profile(PyObject*, PyFrameObject* frame, int what, PyObject*) {
  hold_codes();
  if (!state->recording.load(std::memory_order_relaxed) ||
      static_cast<unsigned long>(pthread_self()) != state->recording_thread.load()) {
    clear_shadow();
    PyEval_SetProfile(nullptr, nullptr);
    return 0;
  }
  if (what == PyTrace_CALL) {
    PyCodeObject* code = PyFrame_GetCode(frame);
    Py_INCREF(frame);
    shadow->push_back({frame, reinterpret_cast<PyObject*>(code)});
    Py_DECREF(code);  // held by the frame
  } else if (what == PyTrace_RETURN) {
    if (!shadow->empty() && shadow->back().frame == frame) {
      PyFrameObject* left = shadow->back().frame;
      shadow->pop_back();
      Py_DECREF(left);
    } else {  // out of step (cannot happen): read the stack afresh
      PyFrameObject* back = PyFrame_GetBack(frame);
      fill_shadow(back);
      Py_XDECREF(back);
    }
  }
  return 0;
}

// Starts keeping the calling thread's shadow stack. With the GIL. A
// profiler the job runs there (cProfile, `sys.setprofile`) is never
// replaced: its storages are then noted without stacks, and the dump says so.
void follow_this_thread() {
  PyThreadState* thread = PyThreadState_Get();
  if (thread->c_profilefunc != nullptr && thread->c_profilefunc != on_profile) {
    state->stacks_lost = true;
    return;
  }
  fill_shadow(PyEval_GetFrame());
  PyEval_SetProfile(on_profile, nullptr);
}

// The Python stack of the calling thread, innermost first, as an index
// into the stack table (kNoStack for a thread other than the recording
// one, or when stacks are off or were lost). Never waits for the GIL.
uint32_t python_stack() {
  if (!state->stacks_on.load(std::memory_order_relaxed) ||
      static_cast<unsigned long>(pthread_self()) != state->recording_thread.load() ||
      shadow == nullptr || shadow->empty()) {
    return kNoStack;
  }
  PyThreadState* thread = PyGILState_GetThisThreadState();
  if (thread == nullptr || thread->c_profilefunc != on_profile) {
    state->stacks_lost.store(true);
    return kNoStack;
  }
  std::vector<Place> places;
  places.reserve(shadow->size());
  for (size_t i = shadow->size(); i-- > 0;) {
    const Shadow& s = (*shadow)[i];
    // Where the frame is now: the instruction running, read from the frame
    // without touching a reference count (its thread is this one).
#if PY_VERSION_HEX >= 0x030B0000
    int offset = PyFrame_GetLasti(s.frame);
#else
    int offset = PyFrame_GetLineNumber(s.frame);  // a line, not an offset
#endif
    places.push_back({s.code, offset});
  }
  // Codes are held at once with the GIL, else before the next Python call
  // or return (while their frames still hold them).
  bool gil = PyGILState_Check() != 0;
  std::lock_guard<std::mutex> lock(state->stacks_mu);
  auto found = state->stack_ids.find(places);
  if (found != state->stack_ids.end()) {
    return found->second;
  }
  for (const Place& p : places) {
    if (gil) {
      Py_INCREF(p.code);
    } else {
      state->codes_to_hold.push_back(p.code);
    }
  }
  if (!gil) {
    state->unheld.store(true, std::memory_order_release);
  }
  uint32_t id = static_cast<uint32_t>(state->stacks.size());
  auto inserted = state->stack_ids.emplace(std::move(places), id);
  state->stacks.push_back(&inserted.first->first);
  return id;
}

void deleter(void* data);

struct Recording final : c10::Allocator {
  c10::DataPtr allocate(size_t n) override {
    c10::DataPtr inner_ptr = inner->allocate(n);
    void* data = inner_ptr.get();
    // Only plain allocations (data is its own context) are wrapped; and
    // nothing is noted in a forked child (its lock may be a copy of one
    // held at the fork).
    if (data == nullptr || inner_ptr.get_context() != data || getpid() != state->pid) {
      return inner_ptr;
    }
    uint32_t stack = state->recording ? python_stack() : kNoStack;
    c10::DeleterFnPtr inner_deleter = inner_ptr.get_deleter();
    inner_ptr.release_context();
    int64_t t = now_us();
    {
      std::lock_guard<std::mutex> lock(state->mu);
      bool recorded = state->recording;
      state->live[data] = Live{n, stack, recorded, inner_deleter};
      if (recorded) {
        state->push(Event{kAllocation, reinterpret_cast<uintptr_t>(data), n, t, stack});
        state->allocations += 1;
        state->active += n;
      }
    }
    return {data, data, &deleter, inner_ptr.device()};
  }

  c10::DeleterFnPtr raw_deleter() const override {
    return &deleter;
  }

  bool is_simple_data_ptr(const c10::DataPtr& ptr) const override {
    return ptr.get() == ptr.get_context();
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    inner->copy_data(dest, src, count);
  }
};

Recording* recording_allocator = nullptr;

void deleter(void* data) {
  c10::DeleterFnPtr inner_deleter = nullptr;
  {
    std::lock_guard<std::mutex> lock(state->mu);
    auto found = state->live.find(data);
    if (found == state->live.end()) {
      return;  // cannot happen: only this file hands out this deleter
    }
    const Live& l = found->second;
    inner_deleter = l.inner_deleter;
    if (l.recorded) {
      state->active -= l.size;
      if (state->recording && getpid() == state->pid) {
        state->push(Event{kRelease, reinterpret_cast<uintptr_t>(data), l.size, now_us(), l.stack});
      }
    }
    state->live.erase(found);
  }
  inner_deleter(data);
}

// The lock is taken around a fork, so that a child never starts with it
// held by a thread it does not have.
void before_fork() {
  state->mu.lock();
}
void after_fork() {
  state->mu.unlock();
}

}  // namespace


namespace {

// The strings the snapshot's records use, memoized first (in this order)
// so that each record names them by memo index, without a look-up.
enum Word : uint8_t {
  kSegments,
  kDevice,
  kAddress,
  kTotalSize,
  kAllocatedSize,
  kActiveSize,
  kRequestedSize,
  kStream,
  kSegmentType,
  kSmall,
  kLarge,
  kSegmentPoolId,
  kIsExpandable,
  kFrames,
  kBlocks,
  kSize,
  kState,
  kActiveAllocated,
  kDeviceTraces,
  kAction,
  kAddr,
  kTimeUs,
  kSnapdiffRecorder,
  kCpu,
  kSnapdiffSkippedTensors,
  kSegmentAlloc,
  kAlloc,
  kFreeRequested,
  kFreeCompleted,
  kSegmentFree,
  kSnapshot,
  kStep,
  kWordCount,
};

const char* const kWords[kWordCount] = {
    "segments",
    "device",
    "address",
    "total_size",
    "allocated_size",
    "active_size",
    "requested_size",
    "stream",
    "segment_type",
    "small",
    "large",
    "segment_pool_id",
    "is_expandable",
    "frames",
    "blocks",
    "size",
    "state",
    "active_allocated",
    "device_traces",
    "action",
    "addr",
    "time_us",
    "snapdiff_recorder",
    "cpu",
    "snapdiff_skipped_tensors",
    "segment_alloc",
    "alloc",
    "free_requested",
    "free_completed",
    "segment_free",
    "snapshot",
    "step",
};

// A frame's items as given (a dict of str keys and str or int values),
// copied so that the file is written without the GIL.
struct FrameItem {
  std::string key;
  bool is_text;
  std::string text;
  long long number;
};

// The frames of the stacks to write: each distinct frame dict once, and
// each stack as indices into them.
struct Frames {
  std::vector<std::vector<FrameItem>> frames;
  std::vector<std::vector<uint32_t>> stacks;
};

// Writes a snapshot as the pickle (protocol 4) that `pickle.dump` of
// `AllocatorRecorder.snapshot()`'s dict would, straight from the state.
// Written by hand because Python's pickler memoizes every dict and list it
// writes: a dump of 100,000 storages spent 3x as long pickling as building.
// What pickle would share is shared here too: strings, frames, frame lists.
class Pickle {
 public:
  Pickle(int fd, const Frames& frames)
      : fd_(fd),
        frames_(frames),
        frame_memo_(frames.frames.size(), -1),
        stack_memo_(frames.stacks.size(), -1) {}

  void op(char c) {
    out_.push_back(c);
  }

  void bytes(const void* data, size_t n) {
    out_.append(static_cast<const char*>(data), n);
  }

  // The low `width` bytes of `v`, little-endian (as the host lays it out).
  void little_endian(uint64_t v, int width) {
    static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "pickle's numbers are little-endian");
    char b[8];
    memcpy(b, &v, sizeof b);
    out_.append(b, static_cast<size_t>(width));
  }

  void integer(uint64_t v) {
    if (v < 256) {
      op('K');  // BININT1
      little_endian(v, 1);
    } else if (v < 65536) {
      op('M');  // BININT2
      little_endian(v, 2);
    } else if (v <= 0x7fffffff) {
      op('J');  // BININT
      little_endian(v, 4);
    } else {
      // LONG1: two's complement, little-endian; a ninth byte keeps the
      // sign of a value with its top bit set.
      bool ninth = v >> 63;
      op('\x8a');
      op(static_cast<char>(ninth ? 9 : 8));
      little_endian(v, 8);
      if (ninth) {
        op('\0');
      }
    }
  }

  void signed_integer(long long v) {
    if (v >= 0) {
      integer(static_cast<uint64_t>(v));
    } else if (v >= INT32_MIN) {
      op('J');
      little_endian(static_cast<uint64_t>(v), 4);
    } else {
      op('\x8a');
      op(8);
      little_endian(static_cast<uint64_t>(v), 8);
    }
  }

  // A string, written once and then fetched from the memo.
  void text(const std::string& s) {
    auto found = memo_of_text_.find(s);
    if (found != memo_of_text_.end()) {
      get(found->second);
      return;
    }
    if (s.size() < 256) {
      op('\x8c');  // SHORT_BINUNICODE
      little_endian(s.size(), 1);
    } else {
      op('X');  // BINUNICODE
      little_endian(s.size(), 4);
    }
    out_.append(s);
    memo_of_text_.emplace(s, memoize());
  }

  // Memoizes every word (see `Word`): pushed, memoized, popped.
  void words() {
    for (const char* w : kWords) {
      size_t n = strlen(w);
      op('\x8c');  // SHORT_BINUNICODE: all of them are short
      little_endian(n, 1);
      bytes(w, n);
      memoize();
      op('0');  // POP
    }
  }

  void word(Word w) {
    get(static_cast<uint32_t>(w));
  }

  // A stack's frame list, written once and then fetched from the memo.
  void stack(uint32_t index) {
    int64_t& memo = stack_memo_[index];
    if (memo >= 0) {
      get(static_cast<uint32_t>(memo));
      return;
    }
    const std::vector<uint32_t>& frames = frames_.stacks[index];
    op(']');  // EMPTY_LIST
    if (!frames.empty()) {
      op('(');  // MARK
      for (uint32_t f : frames) {
        frame(f);
      }
      op('e');  // APPENDS
    }
    memo = memoize();
  }

  // Writes what is buffered once there is enough of it; false on a failed
  // write (errno says why).
  bool flush(bool all) {
    if (!all && out_.size() < (1u << 22)) {
      return true;
    }
    size_t done = 0;
    while (done < out_.size()) {
      ssize_t n = ::write(fd_, out_.data() + done, out_.size() - done);
      if (n < 0) {
        if (errno == EINTR) {
          continue;
        }
        return false;
      }
      done += static_cast<size_t>(n);
    }
    out_.clear();
    return true;
  }

 private:
  void frame(uint32_t index) {
    int64_t& memo = frame_memo_[index];
    if (memo >= 0) {
      get(static_cast<uint32_t>(memo));
      return;
    }
    bytes("}(", 2);  // EMPTY_DICT, MARK
    for (const FrameItem& item : frames_.frames[index]) {
      text(item.key);
      if (item.is_text) {
        text(item.text);
      } else {
        signed_integer(item.number);
      }
    }
    op('u');  // SETITEMS
    memo = memoize();
  }

  uint32_t memoize() {
    op('\x94');  // MEMOIZE
    return memo_count_++;
  }

  void get(uint32_t index) {
    if (index < 256) {
      op('h');  // BINGET
      little_endian(index, 1);
    } else {
      op('j');  // LONG_BINGET
      little_endian(index, 4);
    }
  }

  int fd_;
  const Frames& frames_;
  std::vector<int64_t> frame_memo_;
  std::vector<int64_t> stack_memo_;
  std::unordered_map<std::string, uint32_t> memo_of_text_;
  uint32_t memo_count_ = 0;
  std::string out_;
};

// The frame lists given to `snapdiff_cpu_write`, copied (with the GIL
// held); false with an exception set when one is not a list of dicts of
// str keys and str or int values.
bool copy_frames(PyObject* stacks, Frames& out) {
  if (!PyList_Check(stacks)) {
    PyErr_SetString(PyExc_TypeError, "stack frames must be a list of lists");
    return false;
  }
  std::unordered_map<PyObject*, uint32_t> seen;  // a frame dict -> its index
  auto utf8 = [](PyObject* text, std::string& into) {
    PyObject* encoded = PyUnicode_AsEncodedString(text, "utf-8", "surrogatepass");
    if (encoded == nullptr) {
      return false;
    }
    into.assign(PyBytes_AS_STRING(encoded), static_cast<size_t>(PyBytes_GET_SIZE(encoded)));
    Py_DECREF(encoded);
    return true;
  };
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(stacks); i++) {
    PyObject* frames = PyList_GET_ITEM(stacks, i);
    if (!PyList_Check(frames)) {
      PyErr_SetString(PyExc_TypeError, "stack frames must be a list of lists");
      return false;
    }
    std::vector<uint32_t> indices;
    for (Py_ssize_t j = 0; j < PyList_GET_SIZE(frames); j++) {
      PyObject* frame = PyList_GET_ITEM(frames, j);
      auto found = seen.find(frame);
      if (found != seen.end()) {
        indices.push_back(found->second);
        continue;
      }
      if (!PyDict_Check(frame)) {
        PyErr_SetString(PyExc_TypeError, "a frame must be a dict");
        return false;
      }
      std::vector<FrameItem> items;
      PyObject* key;
      PyObject* value;
      Py_ssize_t at = 0;
      while (PyDict_Next(frame, &at, &key, &value)) {
        FrameItem item{};
        if (!PyUnicode_Check(key) || !utf8(key, item.key)) {
          PyErr_SetString(PyExc_TypeError, "a frame's keys must be str");
          return false;
        }
        if (PyUnicode_Check(value)) {
          item.is_text = true;
          if (!utf8(value, item.text)) {
            return false;
          }
        } else if (PyLong_Check(value)) {
          item.number = PyLong_AsLongLong(value);
          if (item.number == -1 && PyErr_Occurred()) {
            return false;
          }
        } else {
          PyErr_SetString(PyExc_TypeError, "a frame's values must be str or int");
          return false;
        }
        items.push_back(std::move(item));
      }
      uint32_t index = static_cast<uint32_t>(out.frames.size());
      out.frames.push_back(std::move(items));
      seen.emplace(frame, index);
      indices.push_back(index);
    }
    out.stacks.push_back(std::move(indices));
  }
  return true;
}

// PyTorch's trace actions for each of this file's.
const std::vector<Word> kActions[] = {
    {kSegmentAlloc, kAlloc},
    {kFreeRequested, kFreeCompleted, kSegmentFree},
    {kSnapshot},
    {kStep},
};

// PyTorch's split between the small and the large pool, for `segment_type`.
const size_t kSmallSize = 1 << 20;

struct Block {
  uintptr_t address;
  size_t size;
  uint32_t stack;
};

// The recorded live storages in address order, the events, and the
// highest stack either names; the dump's own marker joins the ring after.
// A stack added meanwhile is past the frames the caller gave: it asks again.
struct Copied {
  std::vector<Block> blocks;
  std::vector<Event> events;
  uint32_t highest_stack = 0;
};

Copied copy_state() {
  Copied c;
  std::lock_guard<std::mutex> lock(state->mu);
  c.blocks.reserve(state->live.size());
  for (const auto& entry : state->live) {
    if (entry.second.recorded) {
      c.blocks.push_back(
          {reinterpret_cast<uintptr_t>(entry.first), entry.second.size, entry.second.stack});
      c.highest_stack = std::max(c.highest_stack, entry.second.stack);
    }
  }
  c.events = state->ordered_events();
  for (const Event& e : c.events) {
    c.highest_stack = std::max(c.highest_stack, e.stack);
  }
  return c;
}

void mark_dump() {
  std::lock_guard<std::mutex> lock(state->mu);
  state->push(Event{kDumpMarker, 0, state->active, now_us(), kNoStack});
}

// The trace events, expanded to PyTorch's, of which the newest `capacity`
// are kept: calls `each(name, event)` for each kept one, oldest first.
template <typename Each>
void each_trace_event(const std::vector<Event>& events, size_t capacity, Each each) {
  size_t total = 0;
  for (const Event& e : events) {
    total += kActions[e.action].size();
  }
  size_t skip = total > capacity ? total - capacity : 0;
  for (const Event& e : events) {
    for (Word name : kActions[e.action]) {
      if (skip > 0) {
        skip--;
      } else {
        each(name, e);
      }
    }
  }
}

bool write_pickle(int fd, const Copied& c, const Frames& frames, size_t capacity) {
  Pickle p(fd, frames);
  p.bytes("\x80\x04", 2);  // PROTO 4
  p.words();
  p.bytes("}(", 2);  // EMPTY_DICT, MARK
  p.word(kSegments);
  p.bytes("](", 2);
  for (const Block& b : c.blocks) {
    p.bytes("}(", 2);
    p.word(kDevice);
    p.integer(0);
    p.word(kAddress);
    p.integer(b.address);
    for (Word key : {kTotalSize, kAllocatedSize, kActiveSize, kRequestedSize}) {
      p.word(key);
      p.integer(b.size);
    }
    p.word(kStream);
    p.integer(0);
    p.word(kSegmentType);
    p.word(b.size <= kSmallSize ? kSmall : kLarge);
    p.word(kSegmentPoolId);
    p.bytes("K\0K\0\x86", 5);  // (0, 0)
    p.word(kIsExpandable);
    p.op('\x89');  // False
    p.word(kFrames);
    p.stack(b.stack);
    p.word(kBlocks);
    p.bytes("]}(", 3);
    p.word(kAddress);
    p.integer(b.address);
    p.word(kSize);
    p.integer(b.size);
    p.word(kRequestedSize);
    p.integer(b.size);
    p.word(kState);
    p.word(kActiveAllocated);
    p.word(kFrames);
    p.stack(b.stack);
    p.bytes("uau", 3);  // the block's items, into the list, the segment's items
    if (!p.flush(false)) {
      return false;
    }
  }
  p.op('e');  // APPENDS
  p.word(kDeviceTraces);
  p.bytes("]](", 3);
  bool written = true;
  each_trace_event(c.events, capacity, [&](Word name, const Event& e) {
    p.bytes("}(", 2);
    p.word(kAction);
    p.word(name);
    p.word(kAddr);
    p.integer(e.address);
    p.word(kSize);
    p.integer(e.size);
    p.word(kStream);
    p.integer(0);
    p.word(kTimeUs);
    p.integer(static_cast<uint64_t>(e.time_us));
    p.word(kFrames);
    p.stack(e.stack);
    p.op('u');
    written = written && p.flush(false);
  });
  p.bytes("ea", 2);  // the events into their list, it into device_traces
  p.word(kSnapdiffRecorder);
  p.word(kCpu);
  p.word(kSnapdiffSkippedTensors);
  p.integer(0);
  p.bytes("u.", 2);  // SETITEMS, STOP
  return written && p.flush(true);
}

}  // namespace

extern "C" {

// Starts a recording on the calling thread, forgetting any earlier one:
// 0 when the wrapper is PyTorch's CPU allocator now, 1 when an allocator
// of higher priority is in place (nothing is recorded). With the GIL held.
int snapdiff_cpu_start(size_t max_events, int stacks) {
  if (recording_allocator == nullptr) {
    inner = c10::GetCPUAllocator();
    recording_allocator = new Recording();
    pthread_atfork(before_fork, after_fork, after_fork);
  }
  {
    std::lock_guard<std::mutex> lock(state->mu);
    for (auto& entry : state->live) {
      entry.second.recorded = false;
    }
    state->active = 0;
    state->events.clear();
    state->first = 0;
    state->capacity = max_events > 0 ? max_events : 1;
    state->allocations = 0;
    state->stacks_on = stacks != 0;
    state->stacks_lost = false;
    state->recording_thread = static_cast<unsigned long>(pthread_self());
    state->pid = getpid();
    state->recording = true;
  }
  c10::SetCPUAllocator(recording_allocator, 0);
  if (c10::GetCPUAllocator() != recording_allocator) {
    std::lock_guard<std::mutex> lock(state->mu);
    state->recording = false;
    return 1;
  }
  if (stacks != 0) {
    follow_this_thread();
  }
  return 0;
}

// Has the main thread's stack recorded from now on instead of the calling
// thread's: the main thread takes it over the next time it runs Python
// code (a pending call, which CPython runs on the main thread). For a
// job that imported torch on another thread and trains on the main one.
int take_over_stacks(void*) {
  if (state->recording.load() && state->stacks_on.load()) {
    state->recording_thread = static_cast<unsigned long>(pthread_self());
    follow_this_thread();
  }
  return 0;
}

void snapdiff_cpu_follow_main_thread() {
  Py_AddPendingCall(take_over_stacks, nullptr);
}

// 1 when something else became PyTorch's CPU allocator while recording
// (the job set its own): storages made since are not seen.
int snapdiff_cpu_replaced() {
  return recording_allocator != nullptr && state->recording.load() &&
                 c10::GetCPUAllocator() != recording_allocator
             ? 1
             : 0;
}

// Stops recording and puts the wrapped allocator back. Storages made
// while recording still come back through the wrapper's deleter.
void snapdiff_cpu_stop() {
  if (recording_allocator != nullptr && c10::GetCPUAllocator() == recording_allocator) {
    c10::SetCPUAllocator(inner, 0);
  }
  {
    std::lock_guard<std::mutex> lock(state->mu);
    state->recording = false;
  }
  // Another thread's profile function removes itself at its next call.
  if (static_cast<unsigned long>(pthread_self()) == state->recording_thread.load() &&
      PyGILState_Check()) {
    if (PyThreadState_Get()->c_profilefunc == on_profile) {  // never the job's own
      PyEval_SetProfile(nullptr, nullptr);
    }
    clear_shadow();
  }
}

// Stops noting anything in this process (a forked child) without
// touching PyTorch's allocator.
void snapdiff_cpu_pause() {
  std::lock_guard<std::mutex> lock(state->mu);
  state->recording = false;
}

// Marks in the trace that the job's optimizer is about to take a step, after
// `step` steps: reports cut the trace there.
void snapdiff_cpu_mark_step(uint64_t step) {
  std::lock_guard<std::mutex> lock(state->mu);
  if (state->recording) {
    state->push(Event{kStepMarker, 0, static_cast<size_t>(step), now_us(), kNoStack});
  }
}

// How many storages this recording noted.
uint64_t snapdiff_cpu_allocations() {
  std::lock_guard<std::mutex> lock(state->mu);
  return state->allocations;
}

// The stacks from index `from` on, each a tuple of (code, line), innermost
// first. With the GIL held (ctypes.PyDLL).
PyObject* snapdiff_cpu_stacks(size_t from) {
  hold_codes();
  // Copied first: building the tuples may run Python code (the garbage
  // collector), which must find the table's lock free.
  std::vector<std::vector<Place>> stacks;
  {
    std::lock_guard<std::mutex> lock(state->stacks_mu);
    from = std::max<size_t>(from, 1);
    for (size_t i = from; i < state->stacks.size(); i++) {
      stacks.push_back(*state->stacks[i]);
    }
  }
  PyObject* list = PyList_New(static_cast<Py_ssize_t>(stacks.size()));
  if (list == nullptr) {
    return nullptr;
  }
  for (size_t i = 0; i < stacks.size(); i++) {
    const std::vector<Place>& places = stacks[i];
    PyObject* tuple = PyTuple_New(static_cast<Py_ssize_t>(places.size()));
    if (tuple == nullptr) {
      Py_DECREF(list);
      return nullptr;
    }
    PyList_SET_ITEM(list, static_cast<Py_ssize_t>(i), tuple);
    for (size_t j = 0; j < places.size(); j++) {
      PyObject* code = places[j].code;
#if PY_VERSION_HEX >= 0x030B0000
      int line = PyCode_Addr2Line(reinterpret_cast<PyCodeObject*>(code), places[j].offset);
#else
      int line = places[j].offset;
#endif
      PyObject* place = Py_BuildValue("(Oi)", code, line);
      if (place == nullptr) {
        Py_DECREF(list);
        return nullptr;
      }
      PyTuple_SET_ITEM(tuple, static_cast<Py_ssize_t>(j), place);
    }
  }
  return list;
}

// Whether another profile function replaced this file's on the recording
// thread (its storages are noted without frames since).
int snapdiff_cpu_stacks_lost() {
  return state->stacks_lost.load() ? 1 : 0;
}

// Writes the recording now to `fd` as a pickled snapshot (see `Pickle`),
// `stack_frames[i]` being stack i's frame list. Returns the live blocks
// [(address, size)] when `want_blocks`, else None; -1 when a record names a
// stack past the list (the caller learns the new ones and asks again);
// NULL with an exception set when the file cannot be written. Called with
// the GIL held; the formatting and writing run without it.
PyObject* snapdiff_cpu_write(int fd, PyObject* stack_frames, int want_blocks) {
  Frames frames;
  if (!copy_frames(stack_frames, frames)) {
    return nullptr;
  }
  Copied c = copy_state();
  if (c.highest_stack >= frames.stacks.size()) {
    return PyLong_FromLong(-1);
  }
  size_t capacity;
  {
    std::lock_guard<std::mutex> lock(state->mu);
    capacity = state->capacity;
  }
  mark_dump();
  std::sort(c.blocks.begin(), c.blocks.end(),
            [](const Block& a, const Block& b) { return a.address < b.address; });
  PyObject* blocks = Py_None;
  Py_INCREF(blocks);
  if (want_blocks) {
    Py_DECREF(blocks);
    blocks = PyList_New(static_cast<Py_ssize_t>(c.blocks.size()));
    for (size_t i = 0; blocks != nullptr && i < c.blocks.size(); i++) {
      PyObject* item = Py_BuildValue("(KK)", static_cast<unsigned long long>(c.blocks[i].address),
                                     static_cast<unsigned long long>(c.blocks[i].size));
      if (item == nullptr) {
        Py_CLEAR(blocks);
        break;
      }
      PyList_SET_ITEM(blocks, static_cast<Py_ssize_t>(i), item);
    }
    if (blocks == nullptr) {
      return nullptr;
    }
  }
  bool written;
  Py_BEGIN_ALLOW_THREADS
  written = write_pickle(fd, c, frames, capacity);
  Py_END_ALLOW_THREADS
  if (!written) {
    Py_DECREF(blocks);
    return PyErr_SetFromErrno(PyExc_OSError);
  }
  return blocks;
}

}  // extern "C"
