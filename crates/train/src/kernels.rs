//! The CUDA kernels of `kernels/`, compiled with NVRTC at run time.
//!
//! NVRTC needs no GPU, so compiling is tested everywhere it is installed.
//! It is found by name on the library path (`libnvrtc.so.12`, or the
//! unversioned `libnvrtc.so` a CUDA 13 toolkit's `lib64` has), or in the
//! `nvidia-cuda-nvrtc-cu12` Python wheel, whose library is loaded by its full
//! path so that cudarc then finds it by name.

use cudarc::nvrtc::{CompileOptions, Ptx, compile_ptx_with_opts};

/// The kernel sources, by file name.
pub const SOURCES: &[(&str, &str)] = &[("mlp.cu", include_str!("../../../kernels/mlp.cu"))];

/// The kernels of `mlp.cu` the trainer launches.
pub const MLP_KERNELS: &[&str] = &[
    "matmul",
    "add_bias",
    "relu_backward",
    "softmax_xent",
    "col_sum",
    "adam",
    "ema_rows",
];

/// Why kernels could not be compiled.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// NVRTC is not installed.
    #[error(
        "NVRTC not found: install it with `pip install nvidia-cuda-nvrtc-cu12`, or put the folder \
         holding libnvrtc.so.12 (or a CUDA 13 toolkit's lib64, with libnvrtc.so) on LD_LIBRARY_PATH"
    )]
    NoNvrtc,
    /// A kernel did not compile.
    #[error("{file}: {message}")]
    Compile {
        /// The source file.
        file: String,
        /// NVRTC's log.
        message: String,
    },
}

/// Makes NVRTC loadable, looking in the Python wheel when it is not on the
/// library path. Returns whether it is.
pub fn ensure_nvrtc() -> bool {
    // SAFETY: only probes whether the library can be opened.
    if unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return true;
    }
    let Some(path) = wheel_library() else {
        return false;
    };
    // SAFETY: loads NVRTC's shared library; it stays loaded for the process.
    match unsafe { libloading::Library::new(&path) } {
        Ok(lib) => {
            std::mem::forget(lib);
            // SAFETY: as above.
            unsafe { cudarc::nvrtc::sys::is_culib_present() }
        }
        Err(_) => false,
    }
}

/// `libnvrtc.so.12` of the `nvidia-cuda-nvrtc-cu12` wheel, asking `python3` where it is.
fn wheel_library() -> Option<std::path::PathBuf> {
    let out = std::process::Command::new("python3")
        .args([
            "-c",
            "import nvidia.cuda_nvrtc as m; print(list(m.__path__)[0])",
        ])
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    let dir = String::from_utf8(out.stdout).ok()?;
    let lib = std::path::Path::new(dir.trim())
        .join("lib")
        .join("libnvrtc.so.12");
    lib.is_file().then_some(lib)
}

/// Compiles one kernel source to PTX.
///
/// # Errors
///
/// [`KernelError::NoNvrtc`] without NVRTC, [`KernelError::Compile`] with the
/// compiler's log when the source does not compile.
pub fn compile(file: &str, source: &str) -> Result<Ptx, KernelError> {
    if !ensure_nvrtc() {
        return Err(KernelError::NoNvrtc);
    }
    let options = CompileOptions {
        use_fast_math: Some(false),
        ..Default::default()
    };
    compile_ptx_with_opts(source, options).map_err(|e| KernelError::Compile {
        file: file.to_owned(),
        message: match e {
            cudarc::nvrtc::CompileError::CompileError { log, .. } => {
                log.to_string_lossy().trim().to_owned()
            }
            other => format!("{other:?}"),
        },
    })
}
