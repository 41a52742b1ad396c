//! Backward allocations joined to the forward pass that caused them.
//!
//! In anomaly mode (`torch.autograd.set_detect_anomaly(True)`) PyTorch keeps
//! the Python stack of each forward operation on its autograd node, and the
//! blocks and trace events allocated while that node runs backward carry it
//! as `forward_frames`: a list of strings as Python's
//! `traceback.format_list` writes them, outermost call first
//! (`  File "model.py", line 30, in forward\n    h = self.fc(x)\n`; PyTorch's
//! MemoryViz joins them under "Forward Pass Stack Trace"). Their own
//! `frames` are those of the autograd thread: C++ only, or none at all.
//!
//! On reading, such an allocation's stack becomes its own frames, then the
//! [`Frame::forward_marker`] frame, then the forward frames, innermost
//! first: the forward line reads as a caller of the backward allocation. So
//! one backward operator's blocks from two forward lines are two sites, and
//! a report can name the forward line. `forward_frames` itself stays among
//! the record's extra keys, and the pickle writer writes `frames` only up
//! to the marker, so a file read and written again loses nothing.

use std::collections::HashMap;

use crate::model::{Frame, FrameId, Snapshot, StackId};
use crate::value::Value;

/// The key PyTorch writes the forward stack under.
pub(crate) const KEY: &str = "forward_frames";
/// The name and file of the [`Frame::forward_marker`].
const MARKER_NAME: &str = "(backward)";
const MARKER_FILE: &str = "<autograd>";

impl Frame {
    /// The frame that stands between a backward allocation's own frames and
    /// those of the forward pass that caused it (see the `forward` module).
    /// Told apart by its name and file alone, which no recorder writes, so
    /// that it stays one in tables that keep only those (the fleet's).
    pub fn forward_marker() -> Frame {
        Frame {
            name: MARKER_NAME.into(),
            file: MARKER_FILE.into(),
            line: 0,
            extra: Vec::new(),
        }
    }

    /// Whether this is the [`Frame::forward_marker`].
    pub fn is_forward_marker(&self) -> bool {
        self.name == MARKER_NAME && self.file == MARKER_FILE
    }
}

/// The frames of a `forward_frames` value, innermost first. Lines that are
/// not a traceback entry's `File "...", line N, in NAME` (the source lines
/// under them) are passed over; anything else than a list of strings gives
/// none.
pub(crate) fn parse(value: &Value) -> Vec<Frame> {
    let Value::List(items) = value else {
        return Vec::new();
    };
    let mut frames: Vec<Frame> = items
        .iter()
        .filter_map(|item| match item {
            Value::Str(text) => Some(text.lines()),
            _ => None,
        })
        .flatten()
        .filter_map(entry)
        .collect();
    frames.reverse();
    frames
}

/// The frame of one traceback line, `  File "FILE", line N, in NAME`.
fn entry(line: &str) -> Option<Frame> {
    let rest = line.trim_start().strip_prefix("File \"")?;
    let (file, rest) = rest.rsplit_once("\", line ")?;
    let (number, name) = rest.split_once(", in ")?;
    Some(Frame {
        name: name.trim_end().into(),
        file: file.into(),
        line: number.trim().parse().ok()?,
        extra: Vec::new(),
    })
}

/// Joins the forward frames of every block and trace event that has them to
/// its stack (see the module documentation). A stack that has the marker
/// already (a file snapdiff wrote) is left as it is.
pub(crate) fn join(snap: &mut Snapshot) {
    let blocks_with = snap
        .segments
        .iter()
        .flat_map(|s| &s.blocks)
        .any(|b| b.extra.iter().any(|(k, _)| k == KEY));
    let events_with = snap.traces.iter().any(|t| t.events.any_extra_key(KEY));
    if !blocks_with && !events_with {
        return;
    }
    let mut tables = Tables::new(snap);
    let mut segments = std::mem::take(&mut snap.segments);
    for block in segments.iter_mut().flat_map(|s| &mut s.blocks) {
        if let Some((_, value)) = block.extra.iter().find(|(k, _)| k == KEY) {
            block.stack = tables.joined(block.stack, value);
        }
    }
    snap.segments = segments;
    let mut traces = std::mem::take(&mut snap.traces);
    for trace in &mut traces {
        trace
            .events
            .restack_by_extra_key(KEY, |stack, value| tables.joined(stack, value));
    }
    snap.traces = traces;
    tables.finish(snap);
}

/// The snapshot's frame and stack tables while stacks are joined, with an
/// index of each by content.
struct Tables {
    frames: Vec<Frame>,
    stacks: Vec<Vec<FrameId>>,
    frame_ids: HashMap<Frame, FrameId>,
    stack_ids: HashMap<Vec<FrameId>, StackId>,
    marker: FrameId,
}

impl Tables {
    fn new(snap: &mut Snapshot) -> Tables {
        let frames = std::mem::take(&mut snap.frames);
        let stacks = std::mem::take(&mut snap.stacks);
        let frame_ids = frames
            .iter()
            .enumerate()
            .map(|(i, f)| (f.clone(), i as FrameId))
            .collect();
        let stack_ids = stacks
            .iter()
            .enumerate()
            .map(|(i, s)| (s.clone(), i as StackId))
            .collect();
        let mut tables = Tables {
            frames,
            stacks,
            frame_ids,
            stack_ids,
            marker: 0,
        };
        tables.marker = tables.frame(Frame::forward_marker());
        tables
    }

    fn frame(&mut self, frame: Frame) -> FrameId {
        if let Some(&id) = self.frame_ids.get(&frame) {
            return id;
        }
        let id = self.frames.len() as FrameId;
        self.frames.push(frame.clone());
        self.frame_ids.insert(frame, id);
        id
    }

    /// `stack` with the frames of the `forward_frames` value after it.
    fn joined(&mut self, stack: Option<StackId>, value: &Value) -> Option<StackId> {
        let own = stack.map_or(&[][..], |id| &self.stacks[id as usize][..]);
        if own.contains(&self.marker) {
            return stack;
        }
        let forward = parse(value);
        if forward.is_empty() {
            return stack;
        }
        let mut ids = own.to_vec();
        ids.push(self.marker);
        ids.extend(forward.into_iter().map(|f| self.frame(f)));
        if let Some(&id) = self.stack_ids.get(&ids) {
            return Some(id);
        }
        let id = self.stacks.len() as StackId;
        self.stacks.push(ids.clone());
        self.stack_ids.insert(ids, id);
        Some(id)
    }

    fn finish(self, snap: &mut Snapshot) {
        snap.frames = self.frames;
        snap.stacks = self.stacks;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `traceback.format_list` wrote for a forward call in model.py,
    /// called from train.py: outermost first, each with its source line.
    fn forward_frames() -> Value {
        Value::List(vec![
            Value::Str(
                "  File \"/job/train.py\", line 40, in <module>\n    loss = model(x).sum()\n"
                    .into(),
            ),
            Value::Str(
                "  File \"/job/model.py\", line 30, in forward\n    h = self.fc(x)\n".into(),
            ),
        ])
    }

    #[test]
    fn reads_traceback_entries_innermost_first() {
        let frames = parse(&forward_frames());
        let got: Vec<_> = frames
            .iter()
            .map(|f| (f.name.as_str(), f.file.as_str(), f.line))
            .collect();
        assert_eq!(
            got,
            [
                ("forward", "/job/model.py", 30),
                ("<module>", "/job/train.py", 40)
            ]
        );
        // One string holding several entries (FX's preserved stack trace).
        let joined = Value::List(vec![Value::Str(
            "  File \"a.py\", line 1, in f\n    g()\n  File \"b.py\", line 2, in g\n".into(),
        )]);
        assert_eq!(parse(&joined).len(), 2);
        assert!(parse(&Value::Str("File \"a.py\", line 1, in f".into())).is_empty());
        assert!(parse(&Value::List(vec![Value::Str("not a traceback".into())])).is_empty());
    }

    #[test]
    fn joins_once_and_shares_stacks() {
        let mut snap = Snapshot::default();
        snap.frames.push(Frame {
            name: "forward".into(),
            file: "/job/model.py".into(),
            line: 30,
            extra: Vec::new(),
        });
        snap.stacks.push(vec![0]);
        let block = crate::model::Block {
            stack: None,
            extra: vec![(KEY.to_owned(), forward_frames())].into(),
            ..Default::default()
        };
        snap.segments.push(crate::model::Segment {
            blocks: vec![block.clone(), block],
            ..Default::default()
        });
        join(&mut snap);
        let stacks: Vec<_> = snap.segments[0].blocks.iter().map(|b| b.stack).collect();
        assert_eq!(stacks[0], stacks[1]);
        let frames: Vec<_> = snap.stack_frames(stacks[0]).collect();
        assert!(frames[0].is_forward_marker());
        // The forward frame already in the table is shared, not added again.
        assert_eq!(snap.stacks[stacks[0].unwrap() as usize][1], 0);
        assert_eq!((frames[1].line, frames[2].line), (30, 40));
        let before = snap.clone();
        join(&mut snap);
        assert_eq!(snap, before, "a joined stack is not joined again");
    }
}
