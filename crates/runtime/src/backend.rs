//! Where segments come from: the [`Backend`] trait.
//!
//! The caching allocator asks a backend for whole segments (2 MiB, 20 MiB or
//! larger) and carves blocks out of them itself, as PyTorch's allocator does
//! with `cudaMalloc`. [`HostBackend`](crate::HostBackend) serves segments from
//! host memory with a hard capacity, so that everything, out-of-memory
//! included, runs on any machine; [`CudaBackend`](crate::CudaBackend) serves
//! them from a GPU through the CUDA driver.

use std::fmt;

/// A stream: allocations are cached per stream, as in PyTorch. Its value is
/// recorded in snapshots (PyTorch records the `cudaStream_t` pointer).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Stream(pub u64);

impl Stream {
    /// The default stream.
    pub const DEFAULT: Stream = Stream(0);
}

/// Free and total memory of a device, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryInfo {
    /// Bytes the device can still hand out.
    pub free: u64,
    /// Bytes the device has in all.
    pub total: u64,
}

/// What a device is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceDesc {
    /// Device ordinal, as recorded in snapshots.
    pub ordinal: u32,
    /// Device name (`host`, or the GPU's name).
    pub name: String,
}

/// Why a backend could not allocate a segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackendError {
    /// The device has no room for the segment.
    OutOfMemory,
    /// Anything else the device reported.
    Device(String),
}

impl fmt::Display for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BackendError::OutOfMemory => f.write_str("out of device memory"),
            BackendError::Device(msg) => f.write_str(msg),
        }
    }
}

impl std::error::Error for BackendError {}

/// A source of device memory segments.
///
/// Implementations must be thread-safe; the allocator calls them with its
/// lock held, one call at a time per allocator.
pub trait Backend: Send + Sync + 'static {
    /// Allocates a segment of `size` bytes for `stream` and returns its address.
    fn allocate(&self, size: u64, stream: Stream) -> Result<u64, BackendError>;

    /// Frees the segment at `address`, of `size` bytes, allocated for `stream`.
    fn free(&self, address: u64, size: u64, stream: Stream);

    /// Free and total memory of the device.
    fn memory_info(&self) -> MemoryInfo;

    /// What the device is.
    fn device(&self) -> DeviceDesc;

    /// A host pointer to the memory at `address`, if the host can access it
    /// directly (the host backend); `None` for GPU memory.
    fn host_pointer(&self, address: u64) -> Option<*mut u8>;
}
