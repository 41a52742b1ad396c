//! The recording caching allocator and its buffers: the public handles
//! over the books in `recorder.rs`.

use std::path::Path;
use std::sync::Arc;

use snapdiff_format::Snapshot;

use crate::backend::{Backend, DeviceDesc, Stream};
use crate::caching::BlockIdx;
use crate::config::AllocatorConfig;
use crate::dumps;
use crate::recorder::{AllocError, Recorder, Stats};

/// Why a dump failed.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct DumpError(#[from] snapdiff_format::Error);

/// A caching allocator that records every block it hands out.
///
/// Cloning gives another handle to the same allocator. See the crate
/// documentation for an example.
#[derive(Clone)]
pub struct Allocator {
    pub(crate) recorder: Arc<Recorder>,
}

impl std::fmt::Debug for Allocator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Allocator")
            .field("device", &self.recorder.device)
            .field("stats", &self.stats())
            .finish()
    }
}

/// A block of device memory, freed when dropped.
///
/// Keeping a buffer alive keeps its memory: a leak in a Rust training loop is
/// what it is in PyTorch, a handle kept in a list, a cache or a graph.
pub struct DeviceBuffer {
    recorder: Arc<Recorder>,
    block: BlockIdx,
    address: u64,
    len: u64,
    stream: Stream,
}

impl std::fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("address", &format_args!("0x{:x}", self.address))
            .field("len", &self.len)
            .field("stream", &self.stream)
            .finish()
    }
}

impl Allocator {
    /// An allocator over `backend`, configured by [`AllocatorConfig::from_env`]:
    /// stacks on, and whatever `snapdiff capture` asks for.
    pub fn new(backend: impl Backend) -> Allocator {
        Allocator::with_config(backend, AllocatorConfig::from_env())
    }

    /// An allocator over `backend` with `config` as given.
    pub fn with_config(backend: impl Backend, config: AllocatorConfig) -> Allocator {
        let recorder = Arc::new(Recorder::new(Box::new(backend), config));
        dumps::register(&recorder);
        Allocator { recorder }
    }

    /// The device this allocator serves.
    pub fn device(&self) -> &DeviceDesc {
        &self.recorder.device
    }

    /// The configuration in force.
    pub fn config(&self) -> &AllocatorConfig {
        &self.recorder.config
    }

    /// Allocates `size` bytes for `stream`.
    ///
    /// # Errors
    ///
    /// [`AllocError::OutOfMemory`] when the device is full even after the
    /// cache is released (a snapshot is dumped first when dumps are on).
    pub fn alloc(&self, size: usize, stream: Stream) -> Result<DeviceBuffer, AllocError> {
        match self.recorder.alloc(size, stream) {
            Ok((block, address)) => Ok(DeviceBuffer {
                recorder: self.recorder.clone(),
                block,
                address,
                len: size as u64,
                stream,
            }),
            Err(e) => {
                if let AllocError::OutOfMemory { .. } = e {
                    dumps::auto_dump(&self.recorder, "oom", self.recorder.config.dump_on_oom);
                }
                Err(e)
            }
        }
    }

    /// Returns every cached segment that holds no allocation to the device.
    pub fn empty_cache(&self) {
        self.recorder.empty_cache();
    }

    /// The current statistics.
    pub fn stats(&self) -> Stats {
        self.recorder.stats()
    }

    /// Marks the start of training step `step`: recorded in the trace (where
    /// `snapdiff trend` cuts checkpoints) and in later snapshots. Dumps a
    /// snapshot when dumps every N steps are configured and `step` is a
    /// multiple of N.
    pub fn mark_step(&self, step: u64) {
        self.recorder.mark_step(step);
        if let Some(every) = self.recorder.config.dump_every_steps
            && step.is_multiple_of(every)
        {
            dumps::auto_dump(&self.recorder, &format!("step-{step:06}"), true);
        }
    }

    /// A snapshot of every segment, block and recorded event, consistent at
    /// one moment even while other threads allocate.
    pub fn snapshot(&self) -> Snapshot {
        self.recorder.snapshot()
    }

    /// Writes a snapshot to `path` (`.snap` or `.json`), atomically.
    ///
    /// # Errors
    ///
    /// When the file cannot be written; the allocator keeps working.
    pub fn dump(&self, path: impl AsRef<Path>) -> Result<(), DumpError> {
        let snap = self.snapshot();
        snapdiff_format::write_path(path, &snap, snapdiff_format::Existing::Replace)?;
        Ok(())
    }
}

impl DeviceBuffer {
    /// The device address of the first byte.
    pub fn device_ptr(&self) -> u64 {
        self.address
    }

    /// The number of bytes asked for.
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// Whether the buffer holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The stream the buffer was allocated for.
    pub fn stream(&self) -> Stream {
        self.stream
    }

    /// The bytes, when the host can reach them (the host backend); `None`
    /// for GPU memory.
    pub fn as_host_slice(&self) -> Option<&[u8]> {
        let ptr = self.recorder.backend.host_pointer(self.address)?;
        // SAFETY: the block is this buffer's alone until it is dropped, and
        // the host backend's memory is initialized (allocated zeroed).
        Some(unsafe { std::slice::from_raw_parts(ptr, self.len as usize) })
    }

    /// The bytes, writable, when the host can reach them; `None` for GPU memory.
    pub fn as_host_slice_mut(&mut self) -> Option<&mut [u8]> {
        let ptr = self.recorder.backend.host_pointer(self.address)?;
        // SAFETY: as above, and `&mut self` makes this the only view.
        Some(unsafe { std::slice::from_raw_parts_mut(ptr, self.len as usize) })
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        self.recorder.free(self.block, self.stream);
    }
}
