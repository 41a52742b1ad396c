//! The training workload: it learns, its kernels compile, and the CUDA path
//! fails cleanly without a GPU.

use std::process::Command;

use snapdiff_runtime::{Allocator, AllocatorConfig, HostBackend};
use snapdiff_train::compute::HostCompute;
use snapdiff_train::{Device, Leak, TrainArgs, kernels, train};

#[path = "../../../tests/support/skip.rs"]
mod skipped;
use skipped::skip;

fn args(steps: u64, leak: Leak) -> TrainArgs {
    TrainArgs {
        steps,
        batch: 64,
        hidden: 64,
        lr: 0.003,
        backend: Device::Host,
        leak,
        capacity_mib: 512,
        seed: 7,
        log_every: 0,
    }
}

fn allocator() -> Allocator {
    Allocator::with_config(
        HostBackend::with_capacity(512 << 20),
        AllocatorConfig {
            record_stacks: false,
            ..Default::default()
        },
    )
}

#[test]
fn the_loss_falls() {
    let report = train(&args(60, Leak::None), &allocator(), &HostCompute).unwrap();
    let first: f32 = report.losses[..5].iter().sum::<f32>() / 5.0;
    let last: f32 = report.losses[55..].iter().sum::<f32>() / 5.0;
    assert!(last < 0.6 * first, "loss {first} -> {last}");
}

#[test]
fn each_leak_keeps_memory_and_no_leak_keeps_none() {
    let live_after = |leak, steps| {
        let a = allocator();
        // Run, then look at what is live right before the run's buffers are
        // dropped: a snapshot at the last step mark (allocated bytes there).
        train(&args(steps, leak), &a, &HostCompute).unwrap();
        a.stats().peak_allocated_bytes
    };
    let base = live_after(Leak::None, 30);
    assert_eq!(
        base,
        live_after(Leak::None, 60),
        "without a leak the peak does not grow with steps"
    );
    for leak in [
        Leak::KeepActivations,
        Leak::AccumulateLoss,
        Leak::HiddenState,
    ] {
        assert!(
            live_after(leak, 60) > live_after(leak, 30),
            "{leak:?}: more steps, more memory"
        );
    }
}

#[test]
fn every_kernel_compiles_to_ptx() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../kernels");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "cu"))
        .collect();
    files.sort();
    assert!(!files.is_empty());
    for path in &files {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        assert!(
            kernels::SOURCES.iter().any(|(n, _)| *n == name),
            "{name} is not in kernels::SOURCES"
        );
    }
    if !kernels::ensure_nvrtc() {
        assert!(
            std::env::var_os("SNAPDIFF_REQUIRE_NVRTC").is_none(),
            "NVRTC is required here (SNAPDIFF_REQUIRE_NVRTC) but missing: pip install nvidia-cuda-nvrtc-cu12"
        );
        skip("NVRTC", "pip install nvidia-cuda-nvrtc-cu12");
        return;
    }
    for path in files {
        let source = std::fs::read_to_string(&path).unwrap();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let ptx = kernels::compile(&name, &source)
            .unwrap_or_else(|e| panic!("{e}"))
            .to_src();
        for kernel in kernels::MLP_KERNELS {
            assert!(
                ptx.contains(&format!(".entry {kernel}(")),
                "{name}: no entry {kernel}"
            );
        }
    }
    // A broken kernel is an error with the compiler's log.
    let err =
        kernels::compile("broken.cu", "extern \"C\" __global__ void f() { oops }").unwrap_err();
    assert!(err.to_string().starts_with("broken.cu: "), "{err}");
    assert!(err.to_string().contains("oops"), "{err}");
}

#[test]
fn cuda_without_a_driver_exits_2_with_a_clear_message() {
    let out = Command::new(env!("CARGO_BIN_EXE_snapdiff-train"))
        .args(["--backend", "cuda", "--steps", "1"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    if std::env::var_os("SNAPDIFF_EXPECT_NO_CUDA").is_some() || stderr.contains("no CUDA driver") {
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert_eq!(
            stderr.trim(),
            "snapdiff-train: no CUDA driver found (libcuda.so could not be loaded); use the host backend"
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU and driver"]
fn cuda_kernels_compute_what_the_cpu_computes() {
    use snapdiff_runtime::{CudaBackend, Stream};
    use snapdiff_train::compute::{AdamStep, Compute, CudaCompute};
    use snapdiff_train::tensor::Tensor;

    let gpu = CudaBackend::new(0).expect("a GPU");
    let cuda = CudaCompute::new(gpu.context()).unwrap();
    let ga = Allocator::new(gpu);
    let ha = allocator();
    let data = |n: usize, seed: f32| {
        (0..n)
            .map(|i| (i as f32 * 0.37 + seed).sin())
            .collect::<Vec<f32>>()
    };
    let pair = |rows: usize, cols: usize, seed: f32| {
        let mut h = Tensor::new(
            ha.alloc(4 * rows * cols, Stream::DEFAULT).unwrap(),
            rows,
            cols,
        );
        let mut g = Tensor::new(
            ga.alloc(4 * rows * cols, Stream::DEFAULT).unwrap(),
            rows,
            cols,
        );
        HostCompute.upload(&mut h, &data(rows * cols, seed));
        cuda.upload(&mut g, &data(rows * cols, seed));
        (h, g)
    };
    let close = |a: Vec<f32>, b: Vec<f32>, what: &str| {
        for (i, (x, y)) in a.iter().zip(&b).enumerate() {
            assert!(
                (x - y).abs() <= 1e-4 * (1.0 + x.abs()),
                "{what}[{i}]: cpu {x}, cuda {y}"
            );
        }
    };
    let (a_h, a_g) = pair(7, 5, 0.1);
    let (b_h, b_g) = pair(5, 3, 0.7);
    let (mut o_h, mut o_g) = pair(7, 3, 0.0);
    HostCompute.matmul(&a_h, false, &b_h, false, &mut o_h);
    cuda.matmul(&a_g, false, &b_g, false, &mut o_g);
    close(HostCompute.download(&o_h), cuda.download(&o_g), "matmul");
    let (c_h, c_g) = pair(7, 3, 0.3);
    let (mut t_h, mut t_g) = pair(5, 3, 0.0);
    HostCompute.matmul(&a_h, true, &c_h, false, &mut t_h);
    cuda.matmul(&a_g, true, &c_g, false, &mut t_g);
    close(
        HostCompute.download(&t_h),
        cuda.download(&t_g),
        "matmul transposed",
    );
    let (bias_h, bias_g) = pair(1, 3, 0.5);
    HostCompute.add_bias(&mut o_h, &bias_h, true);
    cuda.add_bias(&mut o_g, &bias_g, true);
    close(HostCompute.download(&o_h), cuda.download(&o_g), "add_bias");
    let (mut labels_h, mut labels_g) = pair(7, 1, 0.0);
    let labels: Vec<f32> = (0..7).map(|i| (i % 3) as f32).collect();
    HostCompute.upload(&mut labels_h, &labels);
    cuda.upload(&mut labels_g, &labels);
    let (mut l_h, mut l_g) = pair(7, 1, 0.0);
    let (mut g_h, mut g_g) = pair(7, 3, 0.0);
    HostCompute.softmax_xent(&o_h, &labels_h, &mut l_h, &mut g_h);
    cuda.softmax_xent(&o_g, &labels_g, &mut l_g, &mut g_g);
    close(HostCompute.download(&l_h), cuda.download(&l_g), "losses");
    close(HostCompute.download(&g_h), cuda.download(&g_g), "dlogits");
    let (mut s_h, mut s_g) = pair(1, 3, 0.0);
    HostCompute.col_sum(&g_h, &mut s_h);
    cuda.col_sum(&g_g, &mut s_g);
    close(HostCompute.download(&s_h), cuda.download(&s_g), "col_sum");
    let (mut m_h, mut m_g) = pair(7, 3, 0.2);
    // Second moments are non-negative.
    let (mut v_h, mut v_g) = pair(7, 3, 0.0);
    HostCompute.upload(&mut v_h, &[0.5; 21]);
    cuda.upload(&mut v_g, &[0.5; 21]);
    let step = AdamStep {
        lr: 0.01,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        t: 3,
    };
    HostCompute.adam(&mut o_h, &g_h, &mut m_h, &mut v_h, step);
    cuda.adam(&mut o_g, &g_g, &mut m_g, &mut v_g, step);
    close(HostCompute.download(&o_h), cuda.download(&o_g), "adam");
    let (mut e_h, mut e_g) = pair(1, 3, 0.0);
    HostCompute.ema_rows(Some(&s_h), &o_h, &mut e_h, 0.9);
    cuda.ema_rows(Some(&s_g), &o_g, &mut e_g, 0.9);
    close(HostCompute.download(&e_h), cuda.download(&e_g), "ema_rows");
}
