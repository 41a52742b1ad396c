//! Tensors: row-major `f32` matrices living in `snapdiff-runtime` buffers.

use snapdiff_runtime::DeviceBuffer;

/// A `rows` x `cols` matrix of `f32` in a device buffer.
pub struct Tensor {
    pub(crate) buf: DeviceBuffer,
    pub(crate) rows: usize,
    pub(crate) cols: usize,
}

impl Tensor {
    /// Wraps a buffer of at least `rows * cols` floats.
    ///
    /// Callers allocate the buffer themselves, on the line that needs the
    /// tensor (`Tensor::new(alloc.alloc(4 * rows * cols, ..)?, rows, cols)`):
    /// that line is what `snapdiff` names when the tensor leaks, where a
    /// helper that allocated would be named for every tensor alike.
    pub fn new(buf: DeviceBuffer, rows: usize, cols: usize) -> Tensor {
        debug_assert!(buf.len() >= rows * cols * 4);
        Tensor { buf, rows, cols }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.rows * self.cols
    }

    /// Whether the tensor has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The device address, for kernels.
    pub(crate) fn ptr(&self) -> u64 {
        self.buf.device_ptr()
    }

    /// The elements, when the buffer is host memory.
    pub(crate) fn host(&self) -> &[f32] {
        let bytes = self.buf.as_host_slice().expect("host memory");
        bytemuck::cast_slice(&bytes[..self.len() * 4])
    }

    /// The elements, writable, when the buffer is host memory.
    pub(crate) fn host_mut(&mut self) -> &mut [f32] {
        let n = self.len() * 4;
        let bytes = self.buf.as_host_slice_mut().expect("host memory");
        bytemuck::cast_slice_mut(&mut bytes[..n])
    }
}
