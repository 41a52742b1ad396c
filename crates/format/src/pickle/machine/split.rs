//! The two halves of a read in two (see `halves.rs`): the first runs the
//! pickle from its start and pauses at the split once the skim has found
//! it; the second runs from the split with what came before stood in for.

use super::*;

/// The first half of a read in two (see `halves.rs`): the pickle run from
/// its start, either to its end, or paused at the split once `split` says
/// where that is.
#[allow(clippy::large_enum_variant, reason = "one per read, moved once")]
pub(crate) enum FirstHalf<'a> {
    Whole(Ran<'a>),
    Paused(Paused<'a>),
}

/// A machine paused at the split, with the top dict's first pairs on its
/// stack.
pub(crate) struct Paused<'a>(Box<Machine<'a>>);

/// Runs the first half of `data`; see [`FirstHalf`].
pub(crate) fn run_first_half(
    data: &[u8],
    split: Arc<SplitPoint>,
    progress: Option<Progress>,
) -> Result<FirstHalf<'_>> {
    let mut m = Machine::new(data);
    m.progress = progress;
    m.split = Some(split);
    m.next_check = 0;
    Ok(match m.execute()? {
        Some(top) => FirstHalf::Whole((top, m.heap, m.lower, m.protocol)),
        None => FirstHalf::Paused(Paused(Box::new(m))),
    })
}

impl<'a> Paused<'a> {
    /// The top dict's pairs read before the split, with the heap and records
    /// behind them and the pickle's protocol, and the progress the machine
    /// was telling (for the caller to tell on); itself back unless the stack
    /// holds just the dict, its mark, and `pairs` pairs, as the skim found.
    ///
    /// Paused inside the trace (`in_trace`), the lists of devices' events so
    /// far are first added to the list of devices, as its APPENDS or APPEND
    /// would, and the key and that list are one more pair.
    pub(crate) fn into_pairs(
        mut self,
        mut pairs: usize,
        in_trace: Option<&InTrace>,
    ) -> std::result::Result<(Half<'a>, Option<Progress>), Paused<'a>> {
        if let Some(t) = in_trace {
            let m = &mut self.0;
            // The key, the list of devices, and its events lists so far.
            let devices = 1 + 2 * pairs + 2;
            let is_list = |v: &Val, events: bool| match v {
                Val::Obj(id) => match m.heap.containers[*id as usize] {
                    Container::List(_) => true,
                    Container::Events { .. } => events,
                    _ => false,
                },
                _ => false,
            };
            // So that adding them cannot fail half done.
            let laid_out = match t.devices_batched {
                true => m.marks == [1, devices] && m.stack.len() == devices + t.devices_before + 1,
                false => m.marks == [1] && m.stack.len() == devices + 1,
            } && is_list(&m.stack[devices - 1], false)
                && m.stack[devices..].iter().all(|v| is_list(v, true));
            let at = m.pos;
            let closed = match t.devices_batched {
                true => laid_out && m.appends(APPENDS, at).is_ok(),
                false => laid_out && m.append(APPEND, at).is_ok(),
            };
            if !closed {
                return Err(self);
            }
            pairs += 1;
        }
        let m = &self.0;
        if m.marks != [1] || m.stack.len() != 1 + 2 * pairs || !m.far_memo.is_empty() {
            return Err(self);
        }
        let Machine {
            stack,
            heap,
            lower,
            protocol,
            progress,
            ..
        } = *self.0;
        let (pairs, _) = stack[1..].as_chunks::<2>();
        let half = Half {
            pairs: pairs.to_vec(),
            heap,
            lower,
            protocol,
        };
        Ok((half, progress))
    }

    /// Runs the rest of the pickle, as if it had never paused.
    pub(crate) fn resume(mut self) -> Result<Ran<'a>> {
        self.0.next_check = self.0.next_progress;
        self.0.run_whole()
    }
}

/// One half of a snapshot read in two: the pairs of the top dict it read,
/// and the heap and records behind them.
pub(crate) struct Half<'a> {
    pub(crate) pairs: Vec<[Val; 2]>,
    pub(crate) heap: Heap<'a>,
    pub(crate) lower: Lowerer,
    pub(crate) protocol: u8,
}

/// Runs the second half of `data`: from the split that `skim` found to the
/// end, with the top dict and its first pairs (read by the first half)
/// stood in for on the stack by `None`s, and the memo slots written before
/// the split read from the file when first used (`foreign.rs`). Gives up
/// with an error (which says nothing worth showing: the first half then
/// reads on alone) when the first half went past the split or failed.
pub(crate) fn run_second_half(
    data: &[u8],
    skim: Split,
    split: Arc<SplitPoint>,
    progress: Option<Progress>,
) -> Result<Half<'_>> {
    let mut m = Machine::new(data);
    m.progress = progress;
    m.split = Some(split);
    m.pos = skim.at;
    m.next_progress = skim.at + PROGRESS_EVERY;
    m.next_check = m.next_progress;
    m.memo.fill_to(skim.made_at.len());
    m.foreign = Some(skim.made_at);
    let top = m.heap.new_dict();
    m.stack.push(Val::Obj(top));
    m.marks.push(1);
    m.stack.resize(1 + 2 * skim.pairs, Val::None);
    if let Some(t) = &skim.in_trace {
        // Inside the trace: the key, a list of devices whose first ones
        // (the first half's) are stood in for, and a new list for the rest
        // of the events of the device the split is in.
        let Some((key, _)) = m.foreign_value(t.key_at, 0) else {
            return Err(m.error_at(ErrorKind::Malformed, "the second half found no trace key"));
        };
        m.stack.push(key);
        m.stack.push(Val::Obj(m.heap.new_list()));
        if t.devices_batched {
            m.marks.push(m.stack.len());
        }
        m.stack.resize(m.stack.len() + t.devices_before, Val::None);
        m.stack.push(Val::Obj(m.heap.new_list()));
    }
    let end = m.execute_whole()?;
    let pairs = match (end, &m.heap.containers[top as usize]) {
        (Val::Obj(id), Container::Dict(pairs)) if id == top => pairs[skim.pairs..].to_vec(),
        _ => return Err(m.error_at(ErrorKind::Malformed, "the second half left no top dict")),
    };
    Ok(Half {
        pairs,
        heap: m.heap,
        lower: m.lower,
        protocol: m.protocol,
    })
}
