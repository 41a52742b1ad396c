//! Device memory from a GPU, through the CUDA driver API (cudarc).
//!
//! cudarc loads `libcuda.so` at run time (feature `dynamic-loading`, with the
//! bindings of CUDA 12.8 fixed at build time), so this builds without the CUDA
//! toolkit or driver. cudarc panics when the library is missing; we check for
//! it first and return an error instead (see `reference/rust-ecosystem.md` §1.2).

use std::sync::Arc;

use cudarc::driver::{CudaContext, DriverError, result, sys};

use crate::backend::{Backend, BackendError, DeviceDesc, MemoryInfo, Stream};

/// A backend that allocates segments on a CUDA GPU with `cuMemAlloc`.
pub struct CudaBackend {
    ctx: Arc<CudaContext>,
    name: String,
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaBackend")
            .field("ordinal", &self.ctx.ordinal())
            .field("name", &self.name)
            .finish()
    }
}

/// Why a [`CudaBackend`] could not be created.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CudaError {
    /// `libcuda.so` could not be loaded.
    #[error("no CUDA driver found (libcuda.so could not be loaded); use the host backend")]
    NoDriver,
    /// The driver is there but reported an error (no GPU, bad ordinal, ...).
    #[error("CUDA device {ordinal}: {message}")]
    Driver {
        /// The ordinal asked for.
        ordinal: usize,
        /// What the driver said.
        message: String,
    },
}

fn describe(e: &DriverError) -> String {
    e.error_string()
        .ok()
        .and_then(|s| s.to_str().ok().map(str::to_owned))
        .unwrap_or_else(|| format!("{e:?}"))
}

impl CudaBackend {
    /// Opens GPU `ordinal`.
    ///
    /// # Errors
    ///
    /// [`CudaError::NoDriver`] on a machine without the CUDA driver (never a
    /// panic), and [`CudaError::Driver`] when the driver has no such device.
    ///
    /// ```
    /// # use snapdiff_runtime::CudaBackend;
    /// match CudaBackend::new(0) {
    ///     Ok(gpu) => println!("{gpu:?}"),
    ///     Err(e) => println!("{e}"), // "no CUDA driver found ...; use the host backend"
    /// }
    /// ```
    pub fn new(ordinal: usize) -> Result<CudaBackend, CudaError> {
        // SAFETY: only probes whether the library can be opened.
        if !unsafe { sys::is_culib_present() } {
            return Err(CudaError::NoDriver);
        }
        let fail = |e: DriverError| CudaError::Driver {
            ordinal,
            message: describe(&e),
        };
        let ctx = CudaContext::new(ordinal).map_err(fail)?;
        let name = ctx.name().map_err(fail)?;
        Ok(CudaBackend { ctx, name })
    }

    /// The cudarc context, for launching kernels on this device's memory.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }
}

impl Backend for CudaBackend {
    fn allocate(&self, size: u64, _stream: Stream) -> Result<u64, BackendError> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| BackendError::Device(describe(&e)))?;
        // Segments are not stream-ordered: like PyTorch's `cudaMalloc`, the
        // allocator itself keeps blocks per stream.
        // SAFETY: allocates device memory; the allocator frees it once with `free`.
        match unsafe { result::malloc_sync(size as usize) } {
            Ok(ptr) => Ok(ptr),
            Err(DriverError(sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY)) => {
                Err(BackendError::OutOfMemory)
            }
            Err(e) => Err(BackendError::Device(describe(&e))),
        }
    }

    fn free(&self, address: u64, _size: u64, _stream: Stream) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: `address` came from `allocate` and is freed once.
            if let Err(e) = unsafe { result::free_sync(address) } {
                eprintln!("snapdiff-runtime: cuMemFree failed: {}", describe(&e));
            }
        }
    }

    fn memory_info(&self) -> MemoryInfo {
        match self.ctx.mem_get_info() {
            Ok((free, total)) => MemoryInfo {
                free: free as u64,
                total: total as u64,
            },
            Err(_) => MemoryInfo {
                free: 0,
                total: self.ctx.total_mem().unwrap_or(0) as u64,
            },
        }
    }

    fn device(&self) -> DeviceDesc {
        DeviceDesc {
            ordinal: self.ctx.ordinal() as u32,
            name: self.name.clone(),
        }
    }

    fn host_pointer(&self, _address: u64) -> Option<*mut u8> {
        None
    }
}
