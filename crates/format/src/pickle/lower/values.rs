//! Generic values: what the schema has no field for, kept as [`Value`]s
//! (and records turned back into values where a file puts them elsewhere),
//! charged against a memory bound.

use super::*;

impl Lowerer {
    /// Converts any value to a generic [`Value`], for keys without a schema.
    pub(crate) fn value(&mut self, heap: &Heap, v: Val, depth: usize) -> Result<Value, Failure> {
        self.charge(std::mem::size_of::<Value>())?;
        self.value_in_slot(heap, v, depth)
    }

    /// [`Lowerer::value`] of an item of a list or map, whose slots were
    /// charged before they were allocated: a list of thousands of
    /// references to itself would otherwise allocate its slots at every
    /// level it is nested to before charging any (512 times the file's
    /// size).
    fn value_in_slot(&mut self, heap: &Heap, v: Val, depth: usize) -> Result<Value, Failure> {
        if depth > MAX_DEPTH {
            return Err(format!(": values nested deeper than {MAX_DEPTH} levels"));
        }
        self.build_frames(heap)?;
        let value = match v {
            Val::Unset | Val::None => Value::None,
            Val::Bool(b) => Value::Bool(b),
            Val::Int(i) => Value::Int(i.into()),
            Val::Big(b) => Value::Int(heap.bigs[b as usize]),
            Val::Float(f) => Value::Float(f),
            Val::Str(id) => {
                self.charge(heap.str(id).len())?;
                Value::Str(heap.str(id).to_owned())
            }
            Val::Bytes(id) => {
                self.charge(heap.bytes[id as usize].len())?;
                Value::Bytes(heap.bytes[id as usize].to_vec())
            }
            Val::Frame(f) => self.charged(frame_value(&self.frames[f as usize]))?,
            Val::Event(i) => self.charged_event(i)?,
            Val::Block(i) => self.charged_block(i)?,
            Val::Stack(s) => self.charged(self.stack_value(Some(s)))?,
            Val::Obj(id) => match &heap.containers[id as usize] {
                Container::List(items) | Container::Tuple(items) | Container::Set(items) => {
                    let mut out = self.charged_slots(items.len())?;
                    for (i, &item) in items.iter().enumerate() {
                        out.push(
                            self.value_in_slot(heap, item, depth + 1)
                                .map_err(|f| index(i, f))?,
                        );
                    }
                    Value::List(out)
                }
                Container::Dict(entries) => {
                    let mut out = self.charged_slots(entries.len())?;
                    for &[k, item] in entries {
                        let key = key_text(heap, k);
                        self.charge(key.len())?;
                        let value = self
                            .value_in_slot(heap, item, depth + 1)
                            .map_err(|f| at(&key, f))?;
                        out.push((key, value));
                    }
                    Value::Map(out)
                }
                Container::Frame(f) => self.charged(frame_value(&self.frames[*f as usize]))?,
                Container::Stack(s) => self.charged(self.stack_value(Some(*s)))?,
                Container::Event(i) => self.charged_event(*i)?,
                &Container::Events { start, len } => {
                    let mut out = self.charged_slots(len as usize)?;
                    for (k, i) in (start..start + len).enumerate() {
                        out.push(self.charged_event(i).map_err(|f| index(k, f))?);
                    }
                    Value::List(out)
                }
                Container::Block(i) => self.charged_block(*i)?,
                &Container::Blocks { start, len } => {
                    let mut out = self.charged_slots(len as usize)?;
                    for (k, i) in (start..start + len).enumerate() {
                        out.push(self.charged_block(i).map_err(|f| index(k, f))?);
                    }
                    Value::List(out)
                }
                Container::Segment(i) => self.charged_segment(*i)?,
                Container::Read => {
                    return Err(": the same segment dict or block list appears twice".to_owned());
                }
            },
        };
        Ok(value)
    }

    /// Lowered event `i` back as a generic value, its size taken from the budget.
    pub(super) fn charged_event(&mut self, i: u32) -> Result<Value, Failure> {
        match self.event_taken.get(i as usize) {
            Some(false) => {
                let event = self.events.get(i as usize).expect("a lowered event");
                self.charged(self.event_value(&event))
            }
            _ => Err(": the same trace event dict appears twice".to_owned()),
        }
    }

    /// Lowered block `i` back as a generic value, its size taken from the budget.
    pub(super) fn charged_block(&mut self, i: u32) -> Result<Value, Failure> {
        match self.blocks.get(i) {
            Some(b) => self.charged(self.block_value(b)),
            None => Err(": the same block dict appears twice".to_owned()),
        }
    }

    /// Lowered segment `i` back as a generic value, its size taken from the budget.
    pub(super) fn charged_segment(&mut self, i: u32) -> Result<Value, Failure> {
        match self.segment_taken.get(i as usize) {
            Some(false) => self.charged(self.segment_value(&self.segments[i as usize])),
            _ => Err(": the same segment dict appears twice".to_owned()),
        }
    }

    /// Takes `bytes` from the budget of generic values; see
    /// [`Lowerer::value_budget`].
    pub(super) fn charge(&mut self, bytes: usize) -> Result<(), Failure> {
        self.value_budget = self.value_budget.checked_sub(bytes).ok_or_else(|| {
            ": the pickle expands to far more values than its size allows (shared containers?)"
                .to_owned()
        })?;
        Ok(())
    }

    /// `text` copied, once its size is taken from the budget.
    pub(crate) fn charged_text(&mut self, text: &str) -> Result<String, Failure> {
        self.charge(text.len())?;
        Ok(text.to_owned())
    }

    /// An empty vector with room for `len` items, once that room is taken
    /// from the budget.
    fn charged_slots<T>(&mut self, len: usize) -> Result<Vec<T>, Failure> {
        self.charge(len.saturating_mul(std::mem::size_of::<T>()))?;
        Ok(Vec::with_capacity(len))
    }

    /// `value`, a record converted back to a generic value, once its size
    /// is taken from the budget. (One record's value is small; it is a record
    /// shared a million times over that the budget stops.)
    pub(super) fn charged(&mut self, value: Value) -> Result<Value, Failure> {
        self.charge(value.approx_size() - std::mem::size_of::<Value>())?;
        Ok(value)
    }

    pub(super) fn stack_value(&self, stack: Option<StackId>) -> Value {
        let ids: &[FrameId] = stack.map_or(&[], |s| self.stacks.get(s));
        Value::List(
            ids.iter()
                .map(|&f| frame_value(&self.frames[f as usize]))
                .collect(),
        )
    }

    /// A lowered event found where the schema has no place for one, back in PyTorch's form.
    pub(super) fn event_value(&self, ev: &TraceEvent) -> Value {
        let mut m = vec![
            ("action".to_owned(), Value::Str(ev.action.name().to_owned())),
            ("addr".to_owned(), Value::Int(ev.address.into())),
            ("size".to_owned(), Value::Int(ev.size.into())),
            ("stream".to_owned(), Value::Int(ev.stream.into())),
        ];
        if let Some(t) = ev.time_us {
            m.push(("time_us".to_owned(), Value::Int(t.into())));
        }
        if ev.stack.is_some() {
            m.push(("frames".to_owned(), self.stack_value(ev.stack)));
        }
        if let Some(d) = &ev.details {
            m.extend(d.extra.iter().cloned());
        }
        Value::Map(m)
    }

    /// A lowered block found where the schema has no place for one, back in PyTorch's form.
    pub(super) fn block_value(&self, b: &StoredBlock) -> Value {
        let extra = b.rare.as_ref().map_or(&[][..], |rare| &rare.1[..]);
        let fields = (b.address, b.size, b.requested_size, b.state, b.stack);
        self.block_fields_value(fields, extra)
    }

    /// A block's address, size, requested size, state and stack, and its
    /// keys the model has no field for, in PyTorch's form.
    pub(super) fn block_fields_value(
        &self,
        (address, size, requested_size, state, stack): (u64, u64, u64, BlockState, Option<StackId>),
        extra: &[(String, Value)],
    ) -> Value {
        let mut m = vec![
            ("address".to_owned(), Value::Int(address.into())),
            ("size".to_owned(), Value::Int(size.into())),
            (
                "requested_size".to_owned(),
                Value::Int(requested_size.into()),
            ),
            ("state".to_owned(), Value::Str(state.name().to_owned())),
            ("frames".to_owned(), self.stack_value(stack)),
        ];
        m.extend(extra.iter().cloned());
        Value::Map(m)
    }

    /// A lowered segment found where the schema has no place for one, back
    /// in PyTorch's form.
    pub(super) fn segment_value(&self, s: &Segment) -> Value {
        let int = |i: i128| Value::Int(i);
        let blocks = s.blocks.iter().map(|b| {
            let fields = (b.address, b.size, b.requested_size, b.state, b.stack);
            self.block_fields_value(fields, &b.extra)
        });
        let mut m = vec![
            ("device".to_owned(), int(s.device.into())),
            ("address".to_owned(), int(s.address.into())),
            ("total_size".to_owned(), int(s.total_size.into())),
            ("stream".to_owned(), int(s.stream.into())),
            (
                "segment_type".to_owned(),
                Value::Str(s.pool.name().to_owned()),
            ),
            (
                "segment_pool_id".to_owned(),
                Value::List(vec![int(s.pool_id.0.into()), int(s.pool_id.1.into())]),
            ),
            ("is_expandable".to_owned(), Value::Bool(s.is_expandable)),
            ("frames".to_owned(), self.stack_value(s.stack)),
            ("blocks".to_owned(), Value::List(blocks.collect())),
        ];
        for (key, size) in [
            ("allocated_size", s.allocated_size),
            ("active_size", s.active_size),
            ("requested_size", s.requested_size),
        ] {
            m.extend(size.map(|size| (key.to_owned(), int(size.into()))));
        }
        m.extend(s.extra.iter().cloned());
        Value::Map(m)
    }
}
