//! The GPU side of the engine: opening the device, a stream to queue work on, and our CUDA
//! kernels, compiled from source when the program starts.
//!
//! Kernels live in `kernels/*.cu` and travel inside the binary (`include_str!`). At
//! start-up NVRTC, NVIDIA's run-time compiler, turns them into PTX for this GPU's
//! architecture, and the driver loads the PTX as a module whose functions we launch.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, anyhow, bail};
use cudarc::cublas::CudaBlas;
use cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT;
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtrMut, DeviceRepr};
use cudarc::nvrtc::{CompileError, CompileOptions, compile_ptx_with_opts};

// ANCHOR: open_gpu
/// Opens GPU 0. cudarc loads the driver library at run time, so we check it is there
/// first: a machine without one gets an error message rather than a panic.
pub fn open_gpu() -> Result<Arc<CudaContext>> {
    // SAFETY: only tries to load libcuda; nothing is called through it.
    let driver_present = unsafe { cudarc::driver::sys::is_culib_present() };
    if !driver_present {
        bail!("no NVIDIA driver found (libcuda.so cannot be loaded); use --no-gpu to validate the files only");
    }
    CudaContext::new(0).context("cannot open GPU 0")
}
// ANCHOR_END: open_gpu

/// The GPU's name and memory, for the run's header.
pub fn describe(ctx: &CudaContext) -> Result<String> {
    let (free, total) = ctx.mem_get_info()?;
    Ok(format!("{} ({:.1} GiB free of {:.1} GiB)", ctx.name()?, gib(free), gib(total)))
}

fn gib(bytes: usize) -> f64 {
    bytes as f64 / (1024.0 * 1024.0 * 1024.0)
}

/// The block-wide sum, maximum and general reduction (`kernels/block_reduce.cuh`),
/// put in front of every kernel's source: one copy, not one per kernel.
const BLOCK_REDUCE: &str = include_str!("../../../kernels/block_reduce.cuh");

// ANCHOR: kernels
/// Every kernel the engine launches.
pub struct Kernels {
    pub embedding: CudaFunction,
    pub rms_norm: CudaFunction,
    pub rope: CudaFunction,
    pub attention_prefill: CudaFunction,
    pub attention_decode_paged: CudaFunction,
    pub attention_merge: CudaFunction,
    pub kv_write: CudaFunction,
    pub swiglu: CudaFunction,
    pub argmax: CudaFunction,
}
// ANCHOR_END: kernels

/// The GPU: the stream all work is queued on, the compiled kernels, and cuBLAS.
pub struct Gpu {
    pub stream: Arc<CudaStream>,
    pub kernels: Kernels,
    /// NVIDIA's matrix library, for the matrix products (on the same stream).
    pub blas: CudaBlas,
    /// The virtual architecture the kernels were compiled for, e.g. `compute_90`.
    pub arch: String,
    /// Streaming multiprocessors: how many blocks run at once, roughly (132 on an H200).
    pub multiprocessors: usize,
    /// Set for `--check`: every op that only writes its output first fills it with NaN (see
    /// [`Gpu::poison`]; ops that update a buffer in place read it, so leave it as it is).
    pub poison_outputs: bool,
}

impl Gpu {
    // ANCHOR: gpu_new
    /// Compiles every kernel for this GPU and loads it.
    pub fn new(ctx: &Arc<CudaContext>, stream: Arc<CudaStream>) -> Result<Self> {
        let (major, minor) = ctx.compute_capability()?;
        if major < 8 {
            bail!(
                "{} has compute capability {major}.{minor}; cuBLAS's bf16 matrix products need 8.0 (Ampere) or newer",
                ctx.name()?
            );
        }
        let arch = format!("compute_{major}{minor}");
        let include_dir = cuda_include_dir()?;
        // Every kernel is compiled after the block-wide reductions they share.
        let compile = |name: &str, source: &str| {
            compile_kernel(ctx, name, &format!("{BLOCK_REDUCE}\n{source}"), &arch, &include_dir)
        };

        let embedding = compile("embedding.cu", include_str!("../../../kernels/embedding.cu"))?;
        let rms_norm = compile("rms_norm.cu", include_str!("../../../kernels/rms_norm.cu"))?;
        let rope = compile("rope.cu", include_str!("../../../kernels/rope.cu"))?;
        let attention = compile("attention_prefill.cu", include_str!("../../../kernels/attention_prefill.cu"))?;
        let decode = compile("attention_decode_paged.cu", include_str!("../../../kernels/attention_decode_paged.cu"))?;
        let kv_write = compile("kv_write.cu", include_str!("../../../kernels/kv_write.cu"))?;
        let swiglu = compile("swiglu.cu", include_str!("../../../kernels/swiglu.cu"))?;
        let argmax = compile("argmax.cu", include_str!("../../../kernels/argmax.cu"))?;
        let kernels = Kernels {
            embedding: embedding.load_function("embedding")?,
            rms_norm: rms_norm.load_function("rms_norm")?,
            rope: rope.load_function("rope")?,
            attention_prefill: attention.load_function("attention_prefill")?,
            attention_decode_paged: decode.load_function("attention_decode_paged")?,
            attention_merge: decode.load_function("attention_merge")?,
            kv_write: kv_write.load_function("kv_write")?,
            swiglu: swiglu.load_function("swiglu")?,
            argmax: argmax.load_function("argmax")?,
        };
        let blas = CudaBlas::new(stream.clone()).context("cannot start cuBLAS")?;
        let multiprocessors = ctx.attribute(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as usize;
        Ok(Gpu { stream, kernels, blas, arch, multiprocessors, poison_outputs: false })
    }
    // ANCHOR_END: gpu_new

    // ANCHOR: alloc_nan
    /// A new buffer with every bit set: NaN for floats, `u32::MAX` (no valid token id) for
    /// ids. Activations start out so, and so a value a kernel forgets to write cannot pass
    /// a check.
    pub fn alloc_nan<T: DeviceRepr>(&self, len: usize) -> Result<CudaSlice<T>> {
        // SAFETY: every byte is set right below, before anything reads the buffer.
        let mut buffer = unsafe { self.stream.alloc::<T>(len) }?;
        fill_with_ones(&self.stream, &mut buffer)?;
        Ok(buffer)
    }

    /// Under `--check`, fills an op's output with NaN before the op writes it, so that a
    /// kernel that skips rows leaves NaN there, not the last forward pass's values. Without
    /// `--check` it does nothing: the forward pass makes no memset.
    pub fn poison<T>(&self, out: &mut impl DevicePtrMut<T>) -> Result<()> {
        if self.poison_outputs {
            fill_with_ones(&self.stream, out)?;
        }
        Ok(())
    }
    // ANCHOR_END: alloc_nan
}

/// Sets every bit of a GPU buffer, on the stream.
fn fill_with_ones<T>(stream: &Arc<CudaStream>, buffer: &mut impl DevicePtrMut<T>) -> Result<()> {
    let bytes = buffer.num_bytes();
    let (pointer, _record) = buffer.device_ptr_mut(stream);
    // SAFETY: `pointer` addresses `bytes` bytes owned by `buffer`, on this stream.
    unsafe { cudarc::driver::result::memset_d8_async(pointer, 0xFF, bytes, stream.cu_stream()) }?;
    Ok(())
}

// ANCHOR: compile_kernel
/// NVRTC: CUDA C++ source → PTX for `arch`; then the driver loads the PTX.
fn compile_kernel(
    ctx: &Arc<CudaContext>,
    name: &str,
    source: &str,
    arch: &str,
    include_dir: &Path,
) -> Result<Arc<CudaModule>> {
    // SAFETY: only tries to load libnvrtc.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        bail!("libnvrtc (NVIDIA's run-time compiler) cannot be loaded: install the CUDA toolkit");
    }
    let options = CompileOptions {
        include_paths: vec![include_dir.display().to_string()],
        options: vec![format!("--gpu-architecture={arch}"), "--std=c++17".to_string()],
        name: Some(name.to_string()),
        ..Default::default()
    };
    let ptx = compile_ptx_with_opts(source, options).map_err(|error| match error {
        CompileError::CompileError { log, .. } => anyhow!("{name} does not compile:\n{}", log.to_string_lossy()),
        other => anyhow!("NVRTC failed on {name}: {other:?}"),
    })?;
    ctx.load_module(ptx).with_context(|| format!("the driver cannot load {name}"))
}
// ANCHOR_END: compile_kernel

/// The CUDA headers (`cuda_bf16.h` and friends) that kernels include:
/// `$CUDA_HOME/include`, `$CUDA_PATH/include`, or `/usr/local/cuda/include`.
fn cuda_include_dir() -> Result<PathBuf> {
    let candidates: Vec<PathBuf> = ["CUDA_HOME", "CUDA_PATH"]
        .iter()
        .filter_map(|var| std::env::var_os(var).map(|dir| Path::new(&dir).join("include")))
        .chain([PathBuf::from("/usr/local/cuda/include")])
        .collect();
    candidates.iter().find(|dir| dir.join("cuda_bf16.h").exists()).cloned().with_context(|| {
        format!(
            "no CUDA headers found (looked for cuda_bf16.h in {}); install the CUDA toolkit or set CUDA_HOME",
            candidates.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", ")
        )
    })
}
