//! The math of the MLP, on the CPU (host backend) or a GPU (CUDA kernels).
//!
//! [`HostCompute`] is the reference: plain loops over the host backend's
//! memory. [`CudaCompute`] launches the kernels of `kernels/mlp.cu` on the
//! same tensors in GPU memory.

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaFunction, CudaStream, LaunchConfig, PushKernelArg, result};

use crate::kernels::{self, MLP_KERNELS};
use crate::tensor::Tensor;

/// Adam's hyper-parameters and step.
#[derive(Clone, Copy, Debug)]
pub struct AdamStep {
    /// Learning rate.
    pub lr: f32,
    /// First-moment decay.
    pub beta1: f32,
    /// Second-moment decay.
    pub beta2: f32,
    /// Added to the denominator.
    pub eps: f32,
    /// The step number, from 1 (for bias correction).
    pub t: u32,
}

/// The operations the training step needs.
pub trait Compute {
    /// `out = op(a) * op(b)`, where `op` transposes when asked.
    fn matmul(&self, a: &Tensor, trans_a: bool, b: &Tensor, trans_b: bool, out: &mut Tensor);
    /// `x[r][c] += bias[c]`, then ReLU if asked.
    fn add_bias(&self, x: &mut Tensor, bias: &Tensor, relu: bool);
    /// Zeroes `grad` where `activation` is not positive.
    fn relu_backward(&self, grad: &mut Tensor, activation: &Tensor);
    /// Per-row cross-entropy losses of `logits` against `labels`, and the
    /// gradient of their mean with respect to the logits.
    fn softmax_xent(
        &self,
        logits: &Tensor,
        labels: &Tensor,
        losses: &mut Tensor,
        grad: &mut Tensor,
    );
    /// `out[c] = sum over rows of x[r][c]`.
    fn col_sum(&self, x: &Tensor, out: &mut Tensor);
    /// One Adam update of `param`.
    fn adam(
        &self,
        param: &mut Tensor,
        grad: &Tensor,
        m: &mut Tensor,
        v: &mut Tensor,
        step: AdamStep,
    );
    /// `out = decay * prev + (1 - decay) * mean of the rows of x` (`prev` may be absent).
    fn ema_rows(&self, prev: Option<&Tensor>, x: &Tensor, out: &mut Tensor, decay: f32);
    /// Copies `data` into `t`.
    fn upload(&self, t: &mut Tensor, data: &[f32]);
    /// Copies `t` out.
    fn download(&self, t: &Tensor) -> Vec<f32>;
}

/// `(m, k, n)` of `op(a) [m x k] * op(b) [k x n]`, `op` transposing when asked.
fn matmul_shape(a: &Tensor, trans_a: bool, b: &Tensor, trans_b: bool) -> (usize, usize, usize) {
    let (m, k) = if trans_a {
        (a.cols, a.rows)
    } else {
        (a.rows, a.cols)
    };
    let n = if trans_b { b.rows } else { b.cols };
    (m, k, n)
}

/// The CPU implementation, on host-backend memory.
pub struct HostCompute;

impl Compute for HostCompute {
    fn matmul(&self, a: &Tensor, trans_a: bool, b: &Tensor, trans_b: bool, out: &mut Tensor) {
        let (m, k, n) = matmul_shape(a, trans_a, b, trans_b);
        let (av, bv) = (a.host(), b.host());
        let o = out.host_mut();
        o[..m * n].fill(0.0);
        for i in 0..m {
            for p in 0..k {
                let x = if trans_a {
                    av[p * m + i]
                } else {
                    av[i * k + p]
                };
                if x == 0.0 {
                    continue;
                }
                for j in 0..n {
                    let y = if trans_b {
                        bv[j * k + p]
                    } else {
                        bv[p * n + j]
                    };
                    o[i * n + j] += x * y;
                }
            }
        }
    }

    fn add_bias(&self, x: &mut Tensor, bias: &Tensor, relu: bool) {
        let cols = x.cols;
        let b = bias.host();
        for (i, v) in x.host_mut().iter_mut().enumerate() {
            let s = *v + b[i % cols];
            *v = if relu && s < 0.0 { 0.0 } else { s };
        }
    }

    fn relu_backward(&self, grad: &mut Tensor, activation: &Tensor) {
        for (g, &a) in grad.host_mut().iter_mut().zip(activation.host()) {
            if a <= 0.0 {
                *g = 0.0;
            }
        }
    }

    fn softmax_xent(
        &self,
        logits: &Tensor,
        labels: &Tensor,
        losses: &mut Tensor,
        grad: &mut Tensor,
    ) {
        let (rows, cols) = (logits.rows, logits.cols);
        let (z, y) = (logits.host(), labels.host());
        let l = losses.host_mut();
        let mut g = vec![0.0f32; rows * cols];
        for r in 0..rows {
            let row = &z[r * cols..(r + 1) * cols];
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let sum: f32 = row.iter().map(|v| (v - max).exp()).sum();
            let label = y[r] as usize;
            l[r] = sum.ln() + max - row[label];
            for c in 0..cols {
                let p = (row[c] - max).exp() / sum;
                g[r * cols + c] = (p - if c == label { 1.0 } else { 0.0 }) / rows as f32;
            }
        }
        grad.host_mut().copy_from_slice(&g);
    }

    fn col_sum(&self, x: &Tensor, out: &mut Tensor) {
        let cols = x.cols;
        let o = out.host_mut();
        o.fill(0.0);
        for (i, &v) in x.host().iter().enumerate() {
            o[i % cols] += v;
        }
    }

    fn adam(&self, param: &mut Tensor, grad: &Tensor, m: &mut Tensor, v: &mut Tensor, s: AdamStep) {
        let (bias1, bias2) = (
            1.0 - s.beta1.powi(s.t as i32),
            1.0 - s.beta2.powi(s.t as i32),
        );
        let (m, v) = (m.host_mut(), v.host_mut());
        for ((p, &g), (mi, vi)) in param
            .host_mut()
            .iter_mut()
            .zip(grad.host())
            .zip(m.iter_mut().zip(v.iter_mut()))
        {
            *mi = s.beta1 * *mi + (1.0 - s.beta1) * g;
            *vi = s.beta2 * *vi + (1.0 - s.beta2) * g * g;
            *p -= s.lr * (*mi / bias1) / ((*vi / bias2).sqrt() + s.eps);
        }
    }

    fn ema_rows(&self, prev: Option<&Tensor>, x: &Tensor, out: &mut Tensor, decay: f32) {
        let (rows, cols) = (x.rows, x.cols);
        let xv = x.host();
        let prev = prev.map(|p| p.host().to_vec());
        let o = out.host_mut();
        for c in 0..cols {
            let mean = (0..rows).map(|r| xv[r * cols + c]).sum::<f32>() / rows as f32;
            o[c] = match &prev {
                Some(p) => decay * p[c] + (1.0 - decay) * mean,
                None => mean,
            };
        }
    }

    fn upload(&self, t: &mut Tensor, data: &[f32]) {
        t.host_mut().copy_from_slice(data);
    }

    fn download(&self, t: &Tensor) -> Vec<f32> {
        t.host().to_vec()
    }
}

/// The GPU implementation: the kernels of `kernels/mlp.cu`.
pub struct CudaCompute {
    stream: Arc<CudaStream>,
    functions: HashMap<&'static str, CudaFunction>,
}

/// Threads per block for element-wise kernels.
const BLOCK: u32 = 256;

fn grid(n: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: ((n as u32).div_ceil(BLOCK).max(1), 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

impl CudaCompute {
    /// Compiles the kernels and loads them on `ctx`'s device.
    ///
    /// # Errors
    ///
    /// When NVRTC is missing, a kernel does not compile, or the driver
    /// refuses the module.
    pub fn new(ctx: &Arc<CudaContext>) -> Result<CudaCompute, crate::TrainError> {
        let (file, source) = kernels::SOURCES[0];
        let ptx = kernels::compile(file, source)?;
        let module = ctx
            .load_module(ptx)
            .map_err(|e| crate::TrainError::Cuda(format!("loading {file}: {e:?}")))?;
        let mut functions = HashMap::new();
        for &name in MLP_KERNELS {
            let f = module
                .load_function(name)
                .map_err(|e| crate::TrainError::Cuda(format!("{name}: {e:?}")))?;
            functions.insert(name, f);
        }
        Ok(CudaCompute {
            stream: ctx.default_stream(),
            functions,
        })
    }
}

/// Launches kernel `$name` of `$compute` with `$cfg` and the arguments
/// (locals, so that they outlive the launch builder that borrows them).
macro_rules! launch {
    ($compute:expr, $name:literal, $cfg:expr, $($arg:expr),+ $(,)?) => {{
        let mut builder = $compute.stream.launch_builder(&$compute.functions[$name]);
        $( builder.arg(&$arg); )+
        // SAFETY: the arguments match the kernel's signature in mlp.cu, and
        // every pointer is a live allocation of the sizes passed along.
        unsafe { builder.launch($cfg) }.unwrap_or_else(|e| panic!("launching {}: {e:?}", $name));
    }};
}

impl Compute for CudaCompute {
    fn matmul(&self, a: &Tensor, trans_a: bool, b: &Tensor, trans_b: bool, out: &mut Tensor) {
        let (m, k, n) = matmul_shape(a, trans_a, b, trans_b);
        let (pa, pb, po) = (a.ptr(), b.ptr(), out.ptr());
        let (m32, k32, n32, ta, tb) =
            (m as i32, k as i32, n as i32, trans_a as i32, trans_b as i32);
        let cfg = LaunchConfig {
            grid_dim: ((n as u32).div_ceil(16), (m as u32).div_ceil(16), 1),
            block_dim: (16, 16, 1),
            shared_mem_bytes: 0,
        };
        launch!(self, "matmul", cfg, pa, pb, po, m32, k32, n32, ta, tb);
    }

    fn add_bias(&self, x: &mut Tensor, bias: &Tensor, relu: bool) {
        let (px, pb, rows, cols, r) = (
            x.ptr(),
            bias.ptr(),
            x.rows as i32,
            x.cols as i32,
            relu as i32,
        );
        launch!(self, "add_bias", grid(x.len()), px, pb, rows, cols, r);
    }

    fn relu_backward(&self, grad: &mut Tensor, activation: &Tensor) {
        let (pg, pa, n) = (grad.ptr(), activation.ptr(), grad.len() as i32);
        launch!(self, "relu_backward", grid(grad.len()), pg, pa, n);
    }

    fn softmax_xent(
        &self,
        logits: &Tensor,
        labels: &Tensor,
        losses: &mut Tensor,
        grad: &mut Tensor,
    ) {
        let (pz, py, pl, pg) = (logits.ptr(), labels.ptr(), losses.ptr(), grad.ptr());
        let (rows, cols) = (logits.rows as i32, logits.cols as i32);
        launch!(
            self,
            "softmax_xent",
            grid(logits.rows),
            pz,
            py,
            pl,
            pg,
            rows,
            cols
        );
    }

    fn col_sum(&self, x: &Tensor, out: &mut Tensor) {
        let (px, po, rows, cols) = (x.ptr(), out.ptr(), x.rows as i32, x.cols as i32);
        launch!(self, "col_sum", grid(x.cols), px, po, rows, cols);
    }

    fn adam(&self, param: &mut Tensor, grad: &Tensor, m: &mut Tensor, v: &mut Tensor, s: AdamStep) {
        let (pp, pg, pm, pv, n) = (
            param.ptr(),
            grad.ptr(),
            m.ptr(),
            v.ptr(),
            param.len() as i32,
        );
        let (bias1, bias2) = (
            1.0 - s.beta1.powi(s.t as i32),
            1.0 - s.beta2.powi(s.t as i32),
        );
        launch!(
            self,
            "adam",
            grid(param.len()),
            pp,
            pg,
            pm,
            pv,
            n,
            s.lr,
            s.beta1,
            s.beta2,
            s.eps,
            bias1,
            bias2
        );
    }

    fn ema_rows(&self, prev: Option<&Tensor>, x: &Tensor, out: &mut Tensor, decay: f32) {
        let (pp, px, po) = (prev.map_or(0u64, Tensor::ptr), x.ptr(), out.ptr());
        let (rows, cols) = (x.rows as i32, x.cols as i32);
        launch!(
            self,
            "ema_rows",
            grid(x.cols),
            pp,
            px,
            po,
            rows,
            cols,
            decay
        );
    }

    fn upload(&self, t: &mut Tensor, data: &[f32]) {
        // SAFETY: `t` is a live allocation of at least `data.len()` floats.
        unsafe { result::memcpy_htod_async(t.ptr(), data, self.stream.cu_stream()) }
            .expect("copy to device");
        self.stream.synchronize().expect("synchronize");
    }

    fn download(&self, t: &Tensor) -> Vec<f32> {
        let mut out = vec![0.0f32; t.len()];
        // SAFETY: `t` is a live allocation of `t.len()` floats.
        unsafe { result::memcpy_dtoh_async(&mut out, t.ptr(), self.stream.cu_stream()) }
            .expect("copy to host");
        self.stream.synchronize().expect("synchronize");
        out
    }
}
