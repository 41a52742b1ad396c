//! Frames and stacks: each distinct frame and frame list interned once,
//! whether the machine read it in one go or it was built opcode by opcode.

use super::*;

impl Lowerer {
    pub(super) fn frame(&mut self, heap: &Heap, entries: &[[Val; 2]]) -> Result<FrameId, Failure> {
        let (mut name, mut file, mut line) = (None, None, None);
        let mut extra = Vec::new();
        for &[k, v] in entries {
            let wrap = |f: Failure| at(&key_text(heap, k), f);
            match heap.key(k) {
                Key::Name => name = Some(str_handle(heap, v).map_err(wrap)?),
                Key::Filename => file = Some(str_handle(heap, v).map_err(wrap)?),
                // Negative lines do not occur; clamp rather than reject.
                Key::Line => {
                    line =
                        Some(u32::try_from(int(heap, v).map_err(wrap)?.max(0)).unwrap_or(u32::MAX))
                }
                _ => extra.push((key_text(heap, k), value_text(heap, v))),
            }
        }
        let name = name.ok_or_else(|| missing("name"))?;
        let file = file.ok_or_else(|| missing("filename"))?;
        let line = line.ok_or_else(|| missing("line"))?;
        if extra.is_empty() {
            return Ok(self.plain_frame(heap, name, file, line));
        }
        let new_id = self.next_frame_id();
        let text = heap.str(name).len()
            + heap.str(file).len()
            + extra.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>();
        let frame = Frame {
            name: heap.str(name).into(),
            file: heap.str(file).into(),
            line,
            extra,
        };
        if let Some(&id) = self.other_frame_ids.get(&frame) {
            return Ok(id);
        }
        // Kept twice: as the frame, and as the key it is found again by.
        self.charge_frame_text(2 * text)?;
        self.other_frame_ids.insert(frame.clone(), new_id);
        self.pending_frames
            .push(PendingFrame::Built(Box::new(frame)));
        Ok(new_id)
    }

    /// The id of the frame with no extra keys whose name and file are
    /// pickled strings `name` and `file`.
    pub(crate) fn plain_frame(&mut self, heap: &Heap, name: u32, file: u32, line: u32) -> FrameId {
        let new_id = self.next_frame_id();
        let key = (self.text_id(heap, name), self.text_id(heap, file), line);
        let id = *self.plain_frame_ids.entry(key).or_insert(new_id);
        if id == new_id {
            self.pending_frames
                .push(PendingFrame::Plain { name, file, line });
            // Charged when the frames are built, where it can fail.
            self.pending_frame_text += heap.str(name).len() + heap.str(file).len();
        }
        id
    }

    /// Takes `bytes` of frame text from its budget; see
    /// [`Lowerer::frame_text_budget`].
    fn charge_frame_text(&mut self, bytes: usize) -> Result<(), Failure> {
        self.frame_text_budget = self.frame_text_budget.checked_sub(bytes).ok_or_else(|| {
            ": its frames' names and files come to far more than its size allows (one long string shared by many frames?)"
                .to_owned()
        })?;
        Ok(())
    }

    /// The id the next new frame gets.
    pub(super) fn next_frame_id(&self) -> FrameId {
        (self.frames.len() + self.pending_frames.len()) as FrameId
    }

    /// Builds the frames still pending. While the pickle runs, a new frame is
    /// only noted (16 bytes); building them all in one go afterwards, away
    /// from the opcodes, costs less than building each as it is found: the
    /// snapviewer sample, with 3295 distinct frames, reads 3% faster.
    pub(crate) fn build_frames(&mut self, heap: &Heap) -> Result<(), Failure> {
        if self.pending_frames.is_empty() {
            return Ok(());
        }
        let text = std::mem::take(&mut self.pending_frame_text);
        self.charge_frame_text(text)?;
        self.frames
            .extend(self.pending_frames.drain(..).map(|pending| match pending {
                PendingFrame::Plain { name, file, line } => Frame {
                    name: heap.str(name).into(),
                    file: heap.str(file).into(),
                    line,
                    extra: Vec::new(),
                },
                PendingFrame::Built(frame) => *frame,
            }));
        Ok(())
    }

    /// The id of pickled string `h`'s text: that of the first pickled string
    /// with the same text. PyTorch shares most frame strings through the
    /// memo, but not all, so frames are matched by text, not by string.
    #[inline(always)]
    pub(super) fn text_id(&mut self, heap: &Heap, h: u32) -> u32 {
        match self.text_ids.get(h as usize) {
            Some(&id) if id != UNSEEN => id,
            _ => self.new_text_id(heap, h),
        }
    }

    /// [`Lowerer::text_id`] for a pickled string not seen before.
    #[cold]
    #[inline(never)]
    pub(super) fn new_text_id(&mut self, heap: &Heap, h: u32) -> u32 {
        let text = heap.str(h);
        let hash = FxBuildHasher.hash_one(text);
        let (_, id) = *self
            .texts
            .entry(
                hash,
                |&(_, other)| same_text(heap.str(other), text),
                |&(hash, _)| hash,
            )
            .or_insert((hash, h))
            .get();
        if h as usize >= self.text_ids.len() {
            self.text_ids.resize(h as usize + 1, UNSEEN);
        }
        self.text_ids[h as usize] = id;
        id
    }

    /// Lowers list `id` to an interned stack if it is a non-empty list of
    /// lowered frames. Called whenever a list is built or grows; most lists
    /// in a snapshot are frame lists, and this keeps them from existing as
    /// lists of handles.
    pub(crate) fn lower_list(&mut self, heap: &mut Heap, id: u32) {
        let Container::List(items) = &heap.containers[id as usize] else {
            return;
        };
        let Some(stack) = self.frames_stack(heap, items) else {
            return;
        };
        heap.settle(id, Record::Stack(stack));
    }

    /// The interned stack of `items`, if they are all lowered frames (and
    /// there is at least one).
    pub(super) fn frames_stack(&mut self, heap: &Heap, items: &[Val]) -> Option<StackId> {
        if items.is_empty() {
            return None;
        }
        self.scratch.clear();
        for &item in items {
            match item {
                Val::Frame(f) => self.scratch.push(f),
                Val::Obj(c) => match heap.containers[c as usize] {
                    Container::Frame(f) => self.scratch.push(f),
                    _ => return None,
                },
                _ => return None,
            }
        }
        Some(self.intern_scratch_stack())
    }

    /// Notes that `items` are being put into a list, and fails if one of them
    /// is a trace event or block dict already put into one: each appears once
    /// in a snapshot, and a file that refers to one many times through the
    /// memo is refused as it is read, before the references pile up.
    pub(crate) fn place(&mut self, heap: &Heap, items: &[Val]) -> Result<(), &'static str> {
        for &item in items {
            let (placed, what) = match item {
                Val::Event(i) => (&mut self.event_placed[i as usize], "trace event"),
                Val::Block(i) => (&mut self.block_placed[i as usize], "block"),
                Val::Obj(c) => match heap.containers[c as usize] {
                    Container::Event(i) => (&mut self.event_placed[i as usize], "trace event"),
                    Container::Block(i) => (&mut self.block_placed[i as usize], "block"),
                    _ => continue,
                },
                _ => continue,
            };
            if std::mem::replace(placed, true) {
                return Err(what);
            }
        }
        Ok(())
    }

    /// Adds `items` to list `id` without copying them into it, when the
    /// list stands for lowered records: frames into an empty list make a
    /// stack, and trace events or blocks that continue the list's run of
    /// them (or start one in an empty list) lengthen it. Says whether it did.
    pub(crate) fn fill_list(&mut self, heap: &mut Heap, id: u32, items: &[Val]) -> bool {
        let run = match heap.containers[id as usize] {
            Container::List(ref v) if v.is_empty() => None,
            Container::Events { start, len } => Some((Run::Events, start, len)),
            Container::Blocks { start, len } => Some((Run::Blocks, start, len)),
            _ => return false,
        };
        let kind = match (run, items.first()) {
            (Some((kind, ..)), _) => Some(kind),
            (None, Some(Val::Event(_))) => Some(Run::Events),
            (None, Some(Val::Block(_))) => Some(Run::Blocks),
            _ => None,
        };
        if let Some(kind) = kind
            && let Some((start, len)) = self.continued_run(kind, run.map(|(_, s, l)| (s, l)), items)
        {
            heap.containers[id as usize] = match kind {
                Run::Events => Container::Events { start, len },
                Run::Blocks => Container::Blocks { start, len },
            };
            return true;
        }
        if run.is_some() {
            return false;
        }
        match self.frames_stack(heap, items) {
            Some(stack) => {
                heap.settle(id, Record::Stack(stack));
                true
            }
            None => false,
        }
    }

    /// If `items` are the lowered records of `kind` that continue `run` (its
    /// start and length; none for an empty list), none of them put into a
    /// list yet: the run's start and length with them, and they are now
    /// placed.
    pub(super) fn continued_run(
        &mut self,
        kind: Run,
        run: Option<(u32, u32)>,
        items: &[Val],
    ) -> Option<(u32, u32)> {
        let (record, placed): (fn(u32) -> Val, _) = match kind {
            Run::Events => (Val::Event, &mut self.event_placed),
            Run::Blocks => (Val::Block, &mut self.block_placed),
        };
        let first = match (kind, items.first()?) {
            (Run::Events, &Val::Event(i)) | (Run::Blocks, &Val::Block(i)) => i,
            _ => return None,
        };
        let (start, len) = run.unwrap_or((first, 0));
        let next = start.checked_add(len)?;
        let in_order = first == next
            && items
                .iter()
                .enumerate()
                .all(|(k, &v)| v == record(next.wrapping_add(k as u32)));
        let fresh = placed.get_mut(next as usize..next as usize + items.len())?;
        if !in_order || fresh.iter().any(|&p| p) {
            return None;
        }
        let len = len.checked_add(u32::try_from(items.len()).ok()?)?;
        fresh.fill(true);
        Some((start, len))
    }

    /// The interned stack of `frames`, which the machine read straight from
    /// a run of memo gets.
    pub(crate) fn intern_stack(&mut self, frames: &[FrameId]) -> StackId {
        self.stacks.intern(frames, <[FrameId]>::to_vec)
    }

    /// Turns lowered stack `id` back into a list, because the pickle adds to it.
    pub(crate) fn unlower_list(&self, heap: &mut Heap, id: u32) {
        let items = match heap.containers[id as usize] {
            Container::Stack(stack) => self
                .stacks
                .get(stack)
                .iter()
                .map(|&f| Val::Frame(f))
                .collect(),
            Container::Events { start, len } => (start..start + len).map(Val::Event).collect(),
            Container::Blocks { start, len } => (start..start + len).map(Val::Block).collect(),
            _ => return,
        };
        heap.containers[id as usize] = Container::List(items);
    }

    pub(super) fn intern_scratch_stack(&mut self) -> StackId {
        self.stacks
            .intern(self.scratch.as_slice(), <[FrameId]>::to_vec)
    }

    /// Converts a `frames` value (a list of frame dicts) to an interned stack;
    /// an empty list is no stack.
    pub(crate) fn stack(&mut self, heap: &Heap, v: Val) -> Result<Option<StackId>, Failure> {
        let expected = |item: Val| format!("expected a frame dict, found {}", describe(heap, item));
        let items = match v {
            Val::None => return Ok(None),
            Val::Stack(s) => return Ok(Some(s)),
            Val::Obj(id) => match &heap.containers[id as usize] {
                Container::Stack(s) => return Ok(Some(*s)),
                Container::List(items) | Container::Tuple(items) => items,
                _ => {
                    return Err(format!(
                        "expected a list of frames, found {}",
                        describe(heap, v)
                    ));
                }
            },
            other => {
                return Err(format!(
                    "expected a list of frames, found {}",
                    describe(heap, other)
                ));
            }
        };
        if items.is_empty() {
            return Ok(None);
        }
        let mut ids = Vec::with_capacity(items.len());
        for (i, &item) in items.iter().enumerate() {
            let id = match item {
                Val::Frame(f) => f,
                Val::Obj(c) => match &heap.containers[c as usize] {
                    Container::Frame(f) => *f,
                    Container::Dict(entries) => {
                        self.frame(heap, entries).map_err(|f| index(i, f))?
                    }
                    _ => return Err(index(i, expected(item))),
                },
                other => return Err(index(i, expected(other))),
            };
            ids.push(id);
        }
        self.scratch = ids;
        Ok(Some(self.intern_scratch_stack()))
    }
}
