//! The machine's errors: each names the opcode, the byte it was at and
//! what the file is, never a panic.

use crate::error::{Error, ErrorKind};
use crate::pickle::machine::{MAX_MARKS, MAX_STACK, Machine};
use crate::pickle::opcodes::{self, GLOBAL};

impl Machine<'_> {
    #[cold]
    pub(super) fn error_at(&self, kind: ErrorKind, msg: impl Into<String>) -> Error {
        Error::new(kind, msg)
    }

    #[cold]
    pub(super) fn too_deep(&self, at: usize) -> Error {
        self.error_at(
            ErrorKind::TooLarge,
            format!(
                "pickle stack over {MAX_STACK} values or {MAX_MARKS} marks deep at byte {at}; \
                 real snapshots stay in the thousands"
            ),
        )
    }

    #[cold]
    pub(super) fn underflow(&self, op: u8, at: usize) -> Error {
        self.error_at(
            ErrorKind::Malformed,
            format!(
                "{} at byte {at} with too few values on the stack",
                opcodes::name(op)
            ),
        )
    }

    #[cold]
    pub(super) fn truncated(&self, op: u8) -> Error {
        Error::new(
            ErrorKind::Truncated,
            format!(
                "truncated at byte {} while reading {}",
                self.data.len(),
                opcodes::name(op)
            ),
        )
    }

    #[cold]
    pub(super) fn refuse_global(&mut self, at: usize) -> Error {
        // GLOBAL's argument is two newline-terminated lines: module and name.
        let rest = &self.data[self.pos.min(self.data.len())..];
        let mut lines = rest
            .split(|&b| b == b'\n')
            .take(2)
            .map(String::from_utf8_lossy);
        let what = match (lines.next(), lines.next()) {
            (Some(m), Some(n)) => format!("{m}.{n}"),
            _ => String::new(),
        };
        self.refuse_object(&what, GLOBAL, at)
    }

    #[cold]
    /// The error for a reference to Python object `name` (`module.name`,
    /// or empty when unreadable).
    pub(super) fn refuse_object(&self, name: &str, op: u8, at: usize) -> Error {
        let hint = if name.starts_with("torch") {
            " (a torch.save of tensors or a model?)"
        } else {
            ""
        };
        // The name is the file's text: quoted short and escaped.
        let what = match name {
            "" => "a Python object".to_owned(),
            name => format!("Python object {}", crate::visible::quoted(name)),
        };
        self.error_at(
            ErrorKind::Refused,
            format!(
                "pickle refers to {what} ({} at byte {at}){hint}; a memory \
                 snapshot holds only plain data, and snapdiff never runs code from a file",
                opcodes::name(op)
            ),
        )
    }

    #[cold]
    pub(super) fn not_a(&self, op: u8, at: usize, what: &str) -> Error {
        self.error_at(
            ErrorKind::Malformed,
            format!(
                "{} at byte {at} on a value that is not a {what}",
                opcodes::name(op)
            ),
        )
    }

    #[cold]
    pub(super) fn changed_after_complete(&self, op: u8, at: usize) -> Error {
        self.error_at(
            ErrorKind::Malformed,
            format!(
                "{} at byte {at} changes a dict or list after it was complete",
                opcodes::name(op)
            ),
        )
    }
}
