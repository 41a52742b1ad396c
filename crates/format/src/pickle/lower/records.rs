//! Trace events, blocks and segments: PyTorch's records converted to the
//! model's, as they complete while the pickle runs or from the top after.

use super::*;

impl Lowerer {
    /// Converts an event dict and adds it to the end of the event store; on
    /// failure the store is left as it was.
    pub(super) fn add_event(&mut self, heap: &Heap, entries: &[[Val; 2]]) -> Result<(), Failure> {
        let event = self.event(heap, entries)?;
        self.events.push(event);
        Ok(())
    }

    /// Converts an event dict.
    ///
    /// Inlined into its callers so that the event's fields go from
    /// registers into the store's columns: built in memory and copied, its
    /// fields were read back by wide loads right after narrow stores, which
    /// stalls store forwarding.
    #[inline(always)]
    pub(super) fn event(
        &mut self,
        heap: &Heap,
        entries: &[[Val; 2]],
    ) -> Result<TraceEvent, Failure> {
        let mut e = BLANK_EVENT;
        let (mut has_action, mut has_size) = (false, false);
        for &[k, v] in entries {
            let wrap = |f: Failure| at(&key_text(heap, k), f);
            match heap.key(k) {
                Key::Action => {
                    e.action = self.action(heap, v).map_err(wrap)?;
                    has_action = true;
                }
                Key::Addr => e.address = u64_of(heap, v).map_err(wrap)?,
                Key::Size => {
                    e.size = u64_of(heap, v).map_err(wrap)?;
                    has_size = true;
                }
                Key::Stream => e.stream = i64_of(heap, v).map_err(wrap)?,
                Key::TimeUs => e.time_us = Some(i64_of(heap, v).map_err(wrap)?),
                Key::Frames => {
                    e.stack = match lowered_stack(heap, v) {
                        Some(stack) => Some(stack),
                        None => self.stack(heap, v).map_err(wrap)?,
                    }
                }
                Key::DeviceFree => {
                    let free = u64_of(heap, v).map_err(wrap)?;
                    e.details_mut().device_free = Some(free);
                }
                Key::CompileContext => {
                    let id = self.event_text(heap, v, EventText::CompileContext);
                    e.compile_context = Some(id.map_err(wrap)?)
                }
                Key::UserMetadata => {
                    let id = self.event_text(heap, v, EventText::UserMetadata);
                    e.user_metadata = Some(id.map_err(wrap)?)
                }
                Key::PoolId => {
                    let pool = pair_of(heap, v).map_err(wrap)?;
                    e.details_mut().pool_id = Some(pool);
                }
                _ => {
                    let value = self.value(heap, v, 1).map_err(wrap)?;
                    let extra = (key_text(heap, k), value);
                    e.details_mut().extra.push(extra);
                }
            }
        }
        if !has_action {
            return Err(missing("action"));
        }
        if !has_size {
            return Err(missing("size"));
        }
        Ok(e)
    }

    /// The action a string names, looked up once per pickled string object.
    pub(super) fn action(&mut self, heap: &Heap, v: Val) -> Result<Action, Failure> {
        let text = str_of(heap, v)?;
        let Val::Str(heap_id) = v else {
            unreachable!("str_of accepted it")
        };
        let slot = heap_id as usize;
        if slot >= self.heap_actions.len() {
            self.heap_actions.resize(slot + 1, None);
        }
        Ok(self.heap_actions[slot]
            .get_or_insert_with(|| Action::from_name(text))
            .clone())
    }

    /// Interns the string of an event's text `field`. A pickled string seen
    /// before is known by its handle. A new one nearly always carries the
    /// field's last text (PyTorch writes `N/A` as a new pickled string each
    /// time), so a short compare with it usually saves hashing it, and
    /// noting its handle, which would not be seen again.
    pub(super) fn event_text(
        &mut self,
        heap: &Heap,
        v: Val,
        field: EventText,
    ) -> Result<StrId, Failure> {
        let handle = str_handle(heap, v)?;
        if let Some(&id) = self.string_ids.get(handle as usize)
            && id != UNSEEN
        {
            return Ok(id);
        }
        let text = heap.str(handle);
        let last = &mut self.last_event_texts[field as usize];
        if let Some(id) = *last
            && same_text(self.strings.get(id), text)
        {
            return Ok(id);
        }
        let id = self.strings.intern(text, str::to_owned);
        *last = Some(id);
        if handle as usize >= self.string_ids.len() {
            self.string_ids.resize(handle as usize + 1, UNSEEN);
        }
        self.string_ids[handle as usize] = id;
        Ok(id)
    }

    /// A block dict, in the form it waits in for its segment.
    pub(super) fn block(
        &mut self,
        heap: &Heap,
        entries: &[[Val; 2]],
    ) -> Result<StoredBlock, Failure> {
        let mut b = StoredBlock {
            address: 0,
            size: 0,
            requested_size: 0,
            stack: None,
            state: BlockState::default(),
            has_address: false,
            rare: None,
        };
        let (mut has_size, mut has_state, mut has_requested) = (false, false, false);
        let (mut history, mut extra) = (ThinVec::new(), ThinVec::new());
        for &[k, v] in entries {
            let wrap = |f: Failure| at(&key_text(heap, k), f);
            match heap.key(k) {
                Key::Address => {
                    b.address = u64_of(heap, v).map_err(wrap)?;
                    b.has_address = true;
                }
                Key::Size => {
                    b.size = u64_of(heap, v).map_err(wrap)?;
                    has_size = true;
                }
                Key::RequestedSize => {
                    b.requested_size = u64_of(heap, v).map_err(wrap)?;
                    has_requested = true;
                }
                Key::State => {
                    let name = str_of(heap, v).map_err(wrap)?;
                    b.state = BlockState::from_name(name).ok_or_else(|| {
                        wrap(format!(
                            "unknown block state {}",
                            crate::visible::quoted(name)
                        ))
                    })?;
                    has_state = true;
                }
                Key::Frames => b.stack = self.stack(heap, v).map_err(wrap)?,
                Key::History => {
                    for (i, &h) in items(heap, v).map_err(wrap)?.iter().enumerate() {
                        let entry = self
                            .history(heap, h)
                            .map_err(|f| at("history", index(i, f)))?;
                        history.push(entry);
                    }
                }
                _ => {
                    let value = self.value(heap, v, 1).map_err(wrap)?;
                    extra.push((key_text(heap, k), value));
                }
            }
        }
        if !has_size {
            return Err(missing("size"));
        }
        if !has_state {
            return Err(missing("state"));
        }
        // Old files: the request and the stack live in the first history entry.
        if let Some(first) = history.first() {
            if !has_requested {
                b.requested_size = first.real_size;
            }
            if b.stack.is_none() {
                b.stack = first.stack;
            }
        } else if !has_requested {
            b.requested_size = b.size;
        }
        if !history.is_empty() || !extra.is_empty() {
            b.rare = Some(Box::new((history, extra)));
        }
        Ok(b)
    }

    pub(super) fn history(&mut self, heap: &Heap, v: Val) -> Result<HistoryEntry, Failure> {
        let mut h = HistoryEntry::default();
        for &[k, v] in entries(heap, v)? {
            let wrap = |f: Failure| at(&key_text(heap, k), f);
            match heap.key(k) {
                Key::Addr => h.address = u64_of(heap, v).map_err(wrap)?,
                Key::RealSize => h.real_size = u64_of(heap, v).map_err(wrap)?,
                Key::Frames => h.stack = self.stack(heap, v).map_err(wrap)?,
                _ => {
                    let value = self.value(heap, v, 1).map_err(wrap)?;
                    h.extra.push((key_text(heap, k), value));
                }
            }
        }
        Ok(h)
    }

    /// Takes the lowered block behind `v`, or converts a generic block dict.
    pub(crate) fn take_block(&mut self, heap: &Heap, v: Val) -> Result<(Block, bool), Failure> {
        let mut take = |i: u32| {
            self.blocks
                .take(i)
                .map(StoredBlock::into_block)
                .ok_or_else(|| ": the same block dict appears twice".to_owned())
        };
        match v {
            Val::Block(i) => take(i),
            Val::Obj(id) => match &heap.containers[id as usize] {
                Container::Block(i) => take(*i),
                Container::Dict(entries) => self.block(heap, entries).map(StoredBlock::into_block),
                _ => Err(format!(
                    ": expected a block dict, found {}",
                    describe(heap, v)
                )),
            },
            other => Err(format!(
                ": expected a block dict, found {}",
                describe(heap, other)
            )),
        }
    }

    /// Lowers a segment dict whose `entries` are all there is of it (as
    /// PyTorch writes each: its fields, then its list of blocks, each block
    /// lowered already) into the segment store, and returns its index. Its
    /// blocks are taken at once, while they and the dict are in cache: made
    /// after the parse, a million blocks' segments took a quarter of a
    /// large file's reading. Anything else is left to the schema pass to
    /// convert or to report, with nothing taken.
    pub(crate) fn lower_segment(&mut self, heap: &Heap, entries: &[[Val; 2]]) -> Option<u32> {
        if !entries.iter().any(|&[k, _]| heap.key(k) == Key::Blocks) {
            return None;
        }
        let (mut segment, _, blocks) = self.segment_fields(heap, entries, false).ok()?;
        if !blocks.iter().all(|&b| self.untaken_block(heap, b)) {
            return None;
        }
        self.take_segment_blocks(heap, &mut segment, &blocks).ok()?;
        self.segments.push(segment);
        self.segment_taken.push(false);
        Some(self.segments.len() as u32 - 1)
    }

    /// Whether `v` is a lowered block still in the store.
    pub(super) fn untaken_block(&self, heap: &Heap, v: Val) -> bool {
        let i = match v {
            Val::Block(i) => i,
            Val::Obj(id) => match heap.containers[id as usize] {
                Container::Block(i) => i,
                _ => return false,
            },
            _ => return false,
        };
        self.blocks.get(i).is_some()
    }

    /// Lowered segment `i`: taken out of the store, or with `keep` copied,
    /// the store keeping it for other readers of its dict. `host` makes it
    /// the pinned host allocator's, whatever device it named.
    pub(crate) fn lowered_segment(
        &mut self,
        i: u32,
        host: bool,
        keep: bool,
    ) -> Result<Segment, Failure> {
        let i = i as usize;
        if self.segment_taken.get(i) != Some(&false) {
            return Err(": the same segment dict appears twice".to_owned());
        }
        let mut segment = if keep {
            self.segments[i].clone()
        } else {
            self.segment_taken[i] = true;
            std::mem::take(&mut self.segments[i])
        };
        if host {
            segment.device = PINNED_HOST_DEVICE;
        }
        Ok(segment)
    }

    /// All the lowered segments, if `items`, a list of segments, holds them
    /// all in order, none taken or held anywhere else: PyTorch's segment
    /// list, moved out whole rather than copied segment by segment.
    pub(crate) fn take_segment_run(&mut self, heap: &Heap, items: &[Val]) -> Option<Vec<Segment>> {
        if items.len() != self.segments.len() || self.segment_taken.iter().any(|&t| t) {
            return None;
        }
        let in_order = items.iter().enumerate().all(|(k, &v)| match v {
            Val::Obj(id) => {
                matches!(heap.containers[id as usize], Container::Segment(i) if i as usize == k)
                    && heap.unshared(v)
            }
            _ => false,
        });
        if !in_order {
            return None;
        }
        self.segment_taken.fill(true);
        Some(std::mem::take(&mut self.segments))
    }

    /// The fields of a segment dict of `entries`, all but its blocks; the
    /// handle of its list of blocks, and the list's items. `host`: the
    /// pinned host allocator's segment, one device whatever it says.
    pub(crate) fn segment_fields<'h>(
        &mut self,
        heap: &'h Heap,
        entries: &[[Val; 2]],
        host: bool,
    ) -> Result<(Segment, Val, std::borrow::Cow<'h, [Val]>), Failure> {
        let mut seg = Segment::default();
        if host {
            seg.device = PINNED_HOST_DEVICE;
        }
        let mut pool = None;
        let (mut has_address, mut has_total) = (false, false);
        let mut block_vals = std::borrow::Cow::Borrowed(&[][..]);
        let mut blocks = Val::None;
        for &[k, v] in entries {
            // Matched as the file spells it; the key's text for messages and
            // `extra` is made only where needed (a segment has a dozen keys).
            let field = match k {
                Val::Str(id) => heap.str(id),
                _ => "",
            };
            let wrap = |f: Failure| at(&key_text(heap, k), f);
            match field {
                // The host allocator's segments are one device, whatever they say.
                "device" if host => {}
                "device" => seg.device = u32_of(heap, v).map_err(wrap)?,
                "address" => {
                    seg.address = u64_of(heap, v).map_err(wrap)?;
                    has_address = true;
                }
                "total_size" => {
                    seg.total_size = u64_of(heap, v).map_err(wrap)?;
                    has_total = true;
                }
                "stream" => seg.stream = i64_of(heap, v).map_err(wrap)?,
                "segment_type" => {
                    let name = str_of(heap, v).map_err(wrap)?;
                    pool = Some(Pool::from_name(name).ok_or_else(|| {
                        wrap(format!(
                            "unknown segment type {}",
                            crate::visible::quoted(name)
                        ))
                    })?);
                }
                "segment_pool_id" => seg.pool_id = pair_of(heap, v).map_err(wrap)?,
                "is_expandable" => seg.is_expandable = bool_of(heap, v).map_err(wrap)?,
                "frames" => seg.stack = self.stack(heap, v).map_err(wrap)?,
                "blocks" => {
                    block_vals = items(heap, v).map_err(wrap)?;
                    blocks = v;
                }
                "allocated_size" => seg.allocated_size = Some(u64_of(heap, v).map_err(wrap)?),
                "active_size" => seg.active_size = Some(u64_of(heap, v).map_err(wrap)?),
                "requested_size" => seg.requested_size = Some(u64_of(heap, v).map_err(wrap)?),
                _ => {
                    let value = self.value(heap, v, 1).map_err(wrap)?;
                    seg.extra.push((key_text(heap, k), value));
                }
            }
        }
        if !has_address {
            return Err(": missing 'address'".to_owned());
        }
        if !has_total {
            return Err(": missing 'total_size'".to_owned());
        }
        seg.pool = pool.unwrap_or(if seg.total_size <= SMALL_SEGMENT_SIZE {
            Pool::Small
        } else {
            Pool::Large
        });
        Ok((seg, blocks, block_vals))
    }

    /// Moves the blocks `items` into `seg`, giving those without an address
    /// (older files leave it out) the one after the block before, as
    /// PyTorch's viewer does.
    pub(crate) fn take_segment_blocks(
        &mut self,
        heap: &Heap,
        seg: &mut Segment,
        items: &[Val],
    ) -> Result<(), Failure> {
        let mut next_address = seg.address;
        seg.blocks.reserve_exact(items.len());
        for (i, &b) in items.iter().enumerate() {
            let (mut block, has_address) = self
                .take_block(heap, b)
                .map_err(|f| at("blocks", index(i, f)))?;
            if !has_address {
                block.address = next_address;
            }
            next_address = block.address.wrapping_add(block.size);
            seg.blocks.push(block);
        }
        Ok(())
    }

    /// Takes the lowered event behind `v`, or converts a generic event dict.
    pub(crate) fn take_event(&mut self, heap: &Heap, v: Val) -> Result<TraceEvent, Failure> {
        // An event moved out with a whole tail of events is past the end of
        // `event_taken`: taken too.
        let mut take = |i: u32| match self.event_taken.get_mut(i as usize) {
            Some(taken) if !*taken => {
                *taken = true;
                Ok(self.events.get(i as usize).expect("a lowered event"))
            }
            _ => Err(": the same trace event dict appears twice".to_owned()),
        };
        match v {
            Val::Event(i) => take(i),
            Val::Obj(id) => match &heap.containers[id as usize] {
                Container::Event(i) => take(*i),
                Container::Dict(entries) => self.event(heap, entries),
                _ => Err(format!(
                    ": expected a trace event dict, found {}",
                    describe(heap, v)
                )),
            },
            other => Err(format!(
                ": expected a trace event dict, found {}",
                describe(heap, other)
            )),
        }
    }

    /// The lowered events `start..` as one vector, if list `items` refers to
    /// exactly them in order. This is the common case (PyTorch writes each
    /// device's events in order, one device after another) and it moves the
    /// events without copying them one by one.
    pub(crate) fn take_event_tail(&mut self, heap: &Heap, items: &[Val]) -> Option<Events> {
        let start = self.events.len().checked_sub(items.len())?;
        let in_order = items.iter().enumerate().all(|(k, &v)| {
            let i = match v {
                Val::Event(i) => i,
                Val::Obj(id) => match heap.containers[id as usize] {
                    Container::Event(i) => i,
                    _ => return false,
                },
                _ => return false,
            };
            i as usize == start + k
        });
        if !in_order {
            return None;
        }
        self.take_events_from(start)
    }

    /// The lowered events of run `start..start + len` as one vector, when
    /// they are the tail of the store (as PyTorch writes them) and none was
    /// taken yet; see [`Lowerer::take_event_tail`].
    pub(crate) fn take_event_run(&mut self, start: u32, len: u32) -> Option<Events> {
        let start = start as usize;
        (start + len as usize == self.events.len())
            .then(|| self.take_events_from(start))
            .flatten()
    }

    /// Moves the lowered events from `start` on out of the store, if none
    /// was taken yet.
    pub(super) fn take_events_from(&mut self, start: usize) -> Option<Events> {
        if self.event_taken[start..].iter().any(|&t| t) {
            return None;
        }
        self.event_taken.truncate(start);
        Some(if start == 0 {
            std::mem::take(&mut self.events)
        } else {
            self.events.split_off(start)
        })
    }
}
