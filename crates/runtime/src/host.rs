//! Device memory simulated in host memory, with a hard capacity.

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::backend::{Backend, BackendError, DeviceDesc, MemoryInfo, Stream};

/// Segment alignment: PyTorch rounds every size to 512 bytes, and CUDA
/// allocations are at least that aligned.
const ALIGN: usize = 512;

/// A backend that serves segments from host memory, up to a capacity.
///
/// Allocation is real (the bytes exist and can be read and written through
/// [`DeviceBuffer::as_host_slice`](crate::DeviceBuffer::as_host_slice)) and
/// so is running out: a segment that would take the total past the capacity
/// fails with [`BackendError::OutOfMemory`], as `cudaMalloc` fails on a full GPU.
#[derive(Debug)]
pub struct HostBackend {
    capacity: u64,
    used: AtomicU64,
    ordinal: u32,
}

impl HostBackend {
    /// A host "device" of `capacity` bytes, ordinal 0.
    ///
    /// ```
    /// use snapdiff_runtime::{Backend, HostBackend, Stream};
    /// let host = HostBackend::with_capacity(1 << 20);
    /// assert!(host.allocate(2 << 20, Stream::DEFAULT).is_err());
    /// ```
    pub fn with_capacity(capacity: u64) -> HostBackend {
        HostBackend {
            capacity,
            used: AtomicU64::new(0),
            ordinal: 0,
        }
    }

    /// The same device with another ordinal, to stand in for one of several devices.
    pub fn with_ordinal(mut self, ordinal: u32) -> HostBackend {
        self.ordinal = ordinal;
        self
    }

    fn layout(size: u64) -> Option<Layout> {
        Layout::from_size_align(usize::try_from(size).ok()?, ALIGN).ok()
    }
}

impl Backend for HostBackend {
    fn allocate(&self, size: u64, _stream: Stream) -> Result<u64, BackendError> {
        let layout = Self::layout(size)
            .filter(|l| l.size() > 0)
            .ok_or(BackendError::OutOfMemory)?;
        // Reserve the bytes first, so that concurrent allocators cannot both pass the check.
        let reserved = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(size)
                    .filter(|&total| total <= self.capacity)
            });
        if reserved.is_err() {
            return Err(BackendError::OutOfMemory);
        }
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        if ptr.is_null() {
            self.used.fetch_sub(size, Ordering::AcqRel);
            return Err(BackendError::OutOfMemory);
        }
        Ok(ptr as u64)
    }

    fn free(&self, address: u64, size: u64, _stream: Stream) {
        let layout = Self::layout(size).expect("a segment this backend allocated");
        // SAFETY: `address` came from `allocate` with the same size, and the
        // allocator frees each segment once.
        unsafe { dealloc(address as *mut u8, layout) };
        self.used.fetch_sub(size, Ordering::AcqRel);
    }

    fn memory_info(&self) -> MemoryInfo {
        let used = self.used.load(Ordering::Acquire);
        MemoryInfo {
            free: self.capacity.saturating_sub(used),
            total: self.capacity,
        }
    }

    fn device(&self) -> DeviceDesc {
        DeviceDesc {
            ordinal: self.ordinal,
            name: "host".to_owned(),
        }
    }

    fn host_pointer(&self, address: u64) -> Option<*mut u8> {
        Some(address as *mut u8)
    }
}
