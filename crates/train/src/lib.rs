//! A small but real training job on `snapdiff-runtime`: an MLP learning a
//! synthetic classification task, every tensor in runtime buffers, on the
//! CPU (host backend) or a GPU (CUDA kernels compiled with NVRTC). `--leak`
//! reproduces the leaks users hit in PyTorch, so that `snapdiff` has
//! something real to find.
//!
//! ```text
//! snapdiff-train --steps 40 --leak keep-activations
//! snapdiff capture -o out --every 5 -- snapdiff-train --steps 40 --leak hidden-state
//! ```

#![deny(missing_docs)]

pub mod compute;
pub mod data;
pub mod kernels;
pub mod model;
pub mod tensor;

use std::sync::atomic::{AtomicUsize, Ordering};

use clap::{Args, ValueEnum};
use snapdiff_runtime::{AllocError, Allocator, CudaBackend, HostBackend, Stream};

use crate::compute::{AdamStep, Compute, CudaCompute, HostCompute};
use crate::data::Teacher;
use crate::model::{Mlp, Shape};
use crate::tensor::Tensor;

/// A leak to reproduce.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Leak {
    /// No leak.
    None,
    /// Each step's activations are appended to a list that lives across steps.
    KeepActivations,
    /// The loss is accumulated as device buffers kept in a running list,
    /// instead of as a number.
    AccumulateLoss,
    /// The state carried to the next step keeps the previous step's buffers
    /// alive (the state is not detached).
    HiddenState,
}

/// Where the tensors live.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Device {
    /// Host memory, CPU math.
    Host,
    /// A CUDA GPU, the kernels of `kernels/`.
    Cuda,
}

/// Options of a training run.
#[derive(Clone, Debug, Args)]
pub struct TrainArgs {
    /// Training steps.
    #[arg(long, default_value_t = 100)]
    pub steps: u64,
    /// Examples per step.
    #[arg(long, default_value_t = 128)]
    pub batch: usize,
    /// Units per hidden layer.
    #[arg(long, default_value_t = 256)]
    pub hidden: usize,
    /// Adam's learning rate.
    #[arg(long, default_value_t = 0.003)]
    pub lr: f32,
    /// Where to train.
    #[arg(long, value_enum, default_value_t = Device::Host)]
    pub backend: Device,
    /// A leak to reproduce.
    #[arg(long, value_enum, default_value_t = Leak::None)]
    pub leak: Leak,
    /// Memory of the host "device", in MiB.
    #[arg(long, value_name = "MIB", default_value_t = 4096)]
    pub capacity_mib: u64,
    /// Random seed of the data and the initial weights.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Print the loss every N steps (0: never).
    #[arg(long, value_name = "N", default_value_t = 10)]
    pub log_every: u64,
}

/// Why a training run failed.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// Out of device memory, or another allocator error.
    #[error(transparent)]
    Alloc(#[from] AllocError),
    /// No CUDA device (or driver) for `--backend cuda`.
    #[error(transparent)]
    NoCuda(#[from] snapdiff_runtime::CudaError),
    /// The kernels could not be compiled.
    #[error(transparent)]
    Kernels(#[from] kernels::KernelError),
    /// The CUDA driver refused something else.
    #[error("CUDA: {0}")]
    Cuda(String),
}

/// The state carried from step to step: a running mean of the last hidden
/// layer's activations. Without `--leak hidden-state` it is detached from
/// the previous step's state; with it, it keeps it alive.
struct Carry {
    mean: Tensor,
    /// Kept only to keep it alive, which is the leak.
    _previous: Option<Box<Carry>>,
}

/// The number of the termination signal received, if any (0: none).
static STOP_SIGNAL: AtomicUsize = AtomicUsize::new(0);

/// What a run produced.
#[derive(Clone, Debug)]
pub struct Report {
    /// Mean loss of each step.
    pub losses: Vec<f32>,
}

/// Sets up the allocator and compute for `args.backend`, then trains.
///
/// # Errors
///
/// When the device cannot be opened, kernels do not compile, or memory runs out.
pub fn run(args: &TrainArgs) -> Result<Report, TrainError> {
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        // Stop between steps: the exit handler then dumps what is live.
        if let Err(e) = register_stop(signal) {
            eprintln!("snapdiff-train: cannot handle signal {signal}: {e}");
        }
    }
    match args.backend {
        Device::Host => {
            let alloc = Allocator::new(HostBackend::with_capacity(args.capacity_mib << 20));
            train(args, &alloc, &HostCompute)
        }
        Device::Cuda => {
            let gpu = CudaBackend::new(0)?;
            let compute = CudaCompute::new(gpu.context())?;
            let alloc = Allocator::new(gpu);
            train(args, &alloc, &compute)
        }
    }
}

/// Records `signal` in [`STOP_SIGNAL`] when it arrives.
fn register_stop(signal: i32) -> std::io::Result<signal_hook::SigId> {
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        signal_hook::low_level::register(signal, move || {
            STOP_SIGNAL.store(signal as usize, Ordering::SeqCst)
        })
    }
}

/// Trains for `args.steps` steps with `alloc` and `compute`.
///
/// # Errors
///
/// When memory runs out.
pub fn train(
    args: &TrainArgs,
    alloc: &Allocator,
    compute: &dyn Compute,
) -> Result<Report, TrainError> {
    const INPUTS: usize = 32;
    const CLASSES: usize = 8;
    let shape = Shape {
        inputs: INPUTS,
        hidden: args.hidden,
        classes: CLASSES,
    };
    let mut teacher = Teacher::new(args.seed ^ 0x5eed, INPUTS, CLASSES);
    let mut model = Mlp::new(alloc, compute, shape, args.seed)?;
    let mut carry: Option<Carry> = None;
    // Where the leaks keep their buffers.
    let mut kept_activations: Vec<Tensor> = Vec::new();
    let mut loss_history: Vec<Tensor> = Vec::new();
    let mut losses = Vec::new();

    for step in 1..=args.steps {
        if let Some(signal) = std::num::NonZeroUsize::new(STOP_SIGNAL.load(Ordering::SeqCst)) {
            eprintln!("snapdiff-train: stopped by signal {signal} at step {step}");
            // Exit here, with the buffers still live, so that the exit dump shows them.
            std::process::exit(128 + signal.get() as i32);
        }
        alloc.mark_step(step);
        let (xs, ys) = teacher.batch(args.batch);
        let mut x = Tensor::new(
            alloc.alloc(4 * args.batch * INPUTS, Stream::DEFAULT)?,
            args.batch,
            INPUTS,
        );
        compute.upload(&mut x, &xs);
        let mut labels = Tensor::new(alloc.alloc(4 * args.batch, Stream::DEFAULT)?, args.batch, 1);
        compute.upload(&mut labels, &ys);

        let fwd = model.forward(alloc, compute, x)?;
        let (step_losses, dlogits) = model.loss(alloc, compute, &fwd, &labels)?;
        let adam = AdamStep {
            lr: args.lr,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            t: step as u32,
        };
        model.backward_and_update(alloc, compute, &fwd, dlogits, adam)?;

        let values = compute.download(&step_losses);
        let loss = values.iter().sum::<f32>() / values.len() as f32;
        losses.push(loss);
        if args.log_every > 0 && (step % args.log_every == 0 || step == 1 || step == args.steps) {
            println!("step {step:>5}/{}  loss {loss:.4}", args.steps);
        }

        let mut mean = Tensor::new(
            alloc.alloc(4 * args.hidden, Stream::DEFAULT)?, // leaks with --leak hidden-state
            1,
            args.hidden,
        );
        compute.ema_rows(carry.as_ref().map(|c| &c.mean), &fwd.h2, &mut mean, 0.9);
        let previous = match args.leak {
            Leak::HiddenState => carry.take().map(Box::new),
            _ => None,
        };
        carry = Some(Carry {
            mean,
            _previous: previous,
        });

        match args.leak {
            Leak::KeepActivations => kept_activations.push(fwd.h1),
            Leak::AccumulateLoss => loss_history.push(step_losses),
            Leak::None | Leak::HiddenState => {}
        }
    }
    Ok(Report { losses })
}
