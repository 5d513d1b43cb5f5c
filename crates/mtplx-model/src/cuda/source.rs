//! The kernels' source (`kernels.cu`), how it is compiled (NVRTC, at run time), and the
//! constants its launches are sized by, which the source's `#define`s must match (a test
//! holds them together on every machine).

use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions};

use crate::error::{ModelError, Result};
use crate::kernels::QuantFormat;

const SOURCE: &str = include_str!("kernels.cu");

/// Threads of a row-wise block (norms, embedding).
pub(super) const ROW_THREADS: u32 = 256;
/// Threads of a QKV split's block: a decode step's one block rotates every Q and K pair and
/// copies V (3,584 items for Llama-3-8B), and each item waits on its loads, so the more
/// threads, the fewer waits in a row (its results do not depend on the count).
pub(super) const QKV_THREADS: u32 = 1024;
/// Warps of a matvec block.
pub(super) const MATVEC_WARPS: u32 = 8;
/// Outputs a matvec warp computes (`OUTS` in the source). Measured when this kernel also
/// ran the decode step (the Llama-3-8B-shaped files through the server on an H100, plain
/// decode at 111 / 421 tokens, tok/s): one output a warp 72.6 / 61.6 (Q4_K_M) and 76.0 /
/// 65.9 (Q4_0); two 80.7 / 68.1 and 96.4 / 79.6; four 66.1 / 57.6 and 90.7 / 75.2.
pub(super) const MATVEC_OUTS: u32 = 2;
/// Rows a matvec block computes per pass over its weights (`ROWS` in the source).
pub(super) const MATVEC_ROWS: usize = 8;
/// Warps of a decode step's matvec block (`MATVEC1_WARPS` in the source, which sets
/// `matvec1_F`'s launch bounds). A source given to `MTPLX_CUDA_KERNELS` may set its own
/// (see [`LaunchShape`]).
pub(super) const MATVEC1_WARPS: u32 = 16;
/// Outputs a decode step's matvec warp computes (`OUTS1` in the source). With four (and 8
/// warps a block), the same files decode at 109.9 / 93.5 (Q4_K_M) and 159.9 / 124.4 (Q4_0)
/// tok/s on an H100, against 85.3 / 69.6 and 99.4 / 79.8 through `matvec_F` in the same
/// run; profiled, the small launches (Q, K, V; the output and down projections: 128-192
/// blocks) kept only 12-17% of the warps a multiprocessor holds busy, at 0.4-0.5 TB/s.
/// With one output a warp and 16 warps a block (32 registers a thread instead of 64-79,
/// so four times the warps in flight, and the same 16-32 outputs a block so x is copied
/// as often), another H100 run: Q4_K_M with `f32` activations 149.0 / 123.7 against 103.5 /
/// 92.2, Q4_0 188.3 / 138.0 against 159.9 / 133.1. The order of each output's sum is the
/// same either way.
pub(super) const MATVEC1_OUTS: u32 = 1;
/// How a source's decode matvec (`matvec1_F`) and attention are launched: its `OUTS1`,
/// `MATVEC1_WARPS`, `ATTEND_WARPS`, `ATILE_GROUPS` and `AMMA_SPAN`, read from the source
/// being compiled, so that a kernel developer's source (`MTPLX_CUDA_KERNELS`) with other
/// values is launched by its own (the built-in source's are [`MATVEC1_OUTS`],
/// [`MATVEC1_WARPS`], [`ATTEND_WARPS`], [`ATTEND_TILE_GROUPS`] and [`ATTEND_MMA_SPAN`], a
/// test holds them equal). A source that does not define one gets the built-in value, but
/// for `AMMA_SPAN`: 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct LaunchShape {
    pub outs: u32,
    pub warps: u32,
    pub attend_warps: u32,
    /// Groups of `attend_warps` warps an attention tile block runs (`attend_tile_h`).
    pub tile_groups: u32,
    /// The most parts a tensor-core attention block may take (`AMMA_SPAN`): 1 for a source
    /// that does not define it, written when a block took one part.
    pub attend_span: u32,
}

impl LaunchShape {
    pub(super) fn of(source: &str) -> Result<LaunchShape> {
        let read = |name: &str, default: u32| match define(source, name) {
            None => Ok(default),
            Some(Ok(v)) if (1..=32).contains(&v) => Ok(v as u32),
            _ => Err(ModelError::Device(format!(
                "the kernels' source: #define {name} is not a number from 1 to 32"
            ))),
        };
        let shape = LaunchShape {
            outs: read("OUTS1", MATVEC1_OUTS)?,
            warps: read("MATVEC1_WARPS", MATVEC1_WARPS)?,
            attend_warps: read("ATTEND_WARPS", ATTEND_WARPS)?,
            tile_groups: read("ATILE_GROUPS", ATTEND_TILE_GROUPS)?,
            attend_span: read("AMMA_SPAN", 1)?,
        };
        // A tile block's groups each take a named barrier (1 .. 15), and it has at most
        // 1,024 threads.
        if shape.tile_groups > 15 || shape.tile_groups * shape.attend_warps > 32 {
            return Err(ModelError::Device(format!(
                "the kernels' source: ATILE_GROUPS {} of {} warps (at most 15 groups, 32 warps)",
                shape.tile_groups, shape.attend_warps
            )));
        }
        Ok(shape)
    }
}

/// The value of the first `#define NAME v` in `source` (`None` where there is none).
fn define(source: &str, name: &str) -> Option<std::result::Result<usize, std::num::ParseIntError>> {
    let prefix = format!("#define {name} ");
    source
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map(|v| v.trim().parse::<usize>())
}

/// Floats of shared memory a chunk of x takes in a decode step's matvec (`XSTRIDE`).
pub(super) const MATVEC1_XSTRIDE: usize = 36;
/// Warps of an attention block (`ATTEND_WARPS` in the source; a kernel developer's source
/// may set its own, see [`LaunchShape`]).
pub(super) const ATTEND_WARPS: u32 = 4;
/// Cache positions an attention part covers (`KEYS` in the source).
pub(crate) const ATTEND_KEYS: usize = 256;
/// Query rows whose attention parts one launch computes (a prefill chunk's rows go in
/// launches of this many, so the parts' buffer stays small at long contexts).
pub(crate) const ATTEND_ROWS: usize = 64;
/// Rows of a launch a prefill attention block takes (`ATILE_ROWS`: `attend_tile_h`).
pub(crate) const ATTEND_TILE_ROWS: usize = 16;
/// Groups of [`ATTEND_WARPS`] warps in an attention tile block (`ATILE_GROUPS`; a kernel
/// developer's source may set its own, see [`LaunchShape`]): each takes the block's (row,
/// head) pairs in turn.
pub(super) const ATTEND_TILE_GROUPS: u32 = 8;
/// The most parts a tensor-core attention block takes (`AMMA_SPAN`; read from the source
/// like the rest of [`LaunchShape`], so only its tests name it).
#[cfg(test)]
pub(super) const ATTEND_MMA_SPAN: u32 = 8;
/// From this many query rows attention takes `attend_tile_h` (the same bits as `attend_h`,
/// so the choice is speed only): a decode step or verify block keeps a block per row.
pub(crate) const ATTEND_TILE_FROM: usize = 16;
/// Warps of a tensor-core attention block (`AMMA_WARPS`): each computes 16 (row, head)
/// pairs, so a block takes [`ATTEND_MMA_PAIRS`] / G rows for G query heads a KV head.
pub(crate) const ATTEND_MMA_WARPS: u32 = 4;
/// (Row, head) pairs a tensor-core attention block computes (`AMMA_PAIRS`).
pub(crate) const ATTEND_MMA_PAIRS: usize = 64;
/// (Row, head) pairs of one `mma` tile: a launch of at most this many pairs (a decode step,
/// a verify block) takes `attend_mma_split_{hd}`, one block whose warps share the tile.
pub(crate) const ATTEND_MMA_TILE_PAIRS: usize = 16;
/// Cache rows of K and of V a tensor-core attention block copies at a time, into each of
/// its two buffers (`AMMA_CHUNK`).
pub(crate) const ATTEND_MMA_CHUNK: usize = 64;
/// Head sizes the tensor-core attention is built for (`attend_mma_64`, `attend_mma_128`).
pub(crate) const ATTEND_MMA_HEADS: [usize; 2] = [64, 128];
/// Dynamic shared memory of a tensor-core attention block for heads of `hd` values: two
/// buffers each of K and V, [`ATTEND_MMA_CHUNK`] rows of `hd + 8` halves.
pub(crate) fn attend_mma_shared(hd: usize) -> usize {
    4 * ATTEND_MMA_CHUNK * (hd + 8) * 2
}
/// Dynamic shared memory an attention block may use without opting in.
pub(super) const MAX_SHARED_BYTES: usize = 48 * 1024;

/// A weight format as the kernels name it (`FMT_*` in the source).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
pub(crate) enum WeightCode {
    F32 = 0,
    F16 = 1,
    BF16 = 2,
    Q4_0 = 3,
    Q4_1 = 4,
    Q5_0 = 5,
    Q5_1 = 6,
    Q8_0 = 7,
    Q4K = 8,
    Q5K = 9,
    Q6K = 10,
}

impl WeightCode {
    /// How many there are (the kernels `matvec_0` … `matvec_10`).
    pub(crate) const COUNT: usize = 11;

    pub(crate) fn of(format: QuantFormat) -> WeightCode {
        match format {
            QuantFormat::F32 => WeightCode::F32,
            QuantFormat::F16 => WeightCode::F16,
            QuantFormat::BF16 => WeightCode::BF16,
            QuantFormat::Q4_0 => WeightCode::Q4_0,
            QuantFormat::Q4_1 => WeightCode::Q4_1,
            QuantFormat::Q5_0 => WeightCode::Q5_0,
            QuantFormat::Q5_1 => WeightCode::Q5_1,
            QuantFormat::Q8_0 => WeightCode::Q8_0,
            QuantFormat::Q4K => WeightCode::Q4K,
            QuantFormat::Q5K => WeightCode::Q5K,
            QuantFormat::Q6K => WeightCode::Q6K,
        }
    }
}

/// Compiles the kernels for `arch` (`compute_90`) with NVRTC: needs the NVRTC library, not
/// a device. Returns the PTX.
pub fn compile(arch: &'static str) -> Result<String> {
    compile_source(SOURCE, arch)
}

/// The kernels' source: the built-in one, or the file `MTPLX_CUDA_KERNELS` names (a kernel
/// developer's hook: another version of `kernels.cu`, with the same kernels and arguments,
/// measured against the built-in one by the same binary in the same run).
pub(super) fn source() -> Result<std::borrow::Cow<'static, str>> {
    match std::env::var_os("MTPLX_CUDA_KERNELS") {
        None => Ok(SOURCE.into()),
        Some(path) => std::fs::read_to_string(&path)
            .map(Into::into)
            .map_err(|e| ModelError::Device(format!("MTPLX_CUDA_KERNELS={path:?}: {e}"))),
    }
}

pub(super) fn compile_source(source: &str, arch: &'static str) -> Result<String> {
    let ptx = quietly(|| {
        compile_ptx_with_opts(
            source,
            CompileOptions {
                fmad: Some(false),
                arch: Some(arch),
                ..Default::default()
            },
        )
    })
    .map_err(|_| ModelError::Device("the NVRTC library is not installed".into()))?
    .map_err(|e| ModelError::Device(format!("compile the kernels: {e:?}")))?;
    Ok(ptx.to_src())
}

/// Runs `f`, catching a panic, with the panic hook silent on this thread meanwhile. The
/// driver and NVRTC libraries are loaded on first use and panic where absent: that is an
/// error for the caller to report in one line, not a panic message and backtrace first.
pub(super) fn quietly<T>(f: impl FnOnce() -> T) -> std::thread::Result<T> {
    use std::cell::Cell;
    use std::sync::Once;
    thread_local! {
        static QUIET: Cell<bool> = const { Cell::new(false) };
    }
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !QUIET.with(Cell::get) {
                hook(info)
            }
        }));
    });
    struct Loud;
    impl Drop for Loud {
        fn drop(&mut self) {
            QUIET.with(|q| q.set(false));
        }
    }
    QUIET.with(|q| q.set(true));
    let _loud = Loud;
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value of `#define NAME v` in the kernels' source.
    fn define(name: &str) -> usize {
        let prefix = format!("#define {name} ");
        let mut values = SOURCE
            .lines()
            .filter_map(|l| l.strip_prefix(&prefix))
            .map(|v| v.trim().parse::<usize>().expect("a number"));
        let v = values.next().unwrap_or_else(|| panic!("no #define {name}"));
        assert!(values.next().is_none(), "#define {name} twice");
        v
    }

    /// Every kernel of the built-in source orders itself after the one before it
    /// (`GRID_ORDER`, or `matvec1_body`'s `GRID_WAIT` after its prefetch) within its first
    /// lines, so that programmatic launch (`graph.rs`) stays possible: the device checks the
    /// compiled PTX and turns it off for a source with one kernel that does not wait; this
    /// says so where no NVRTC is installed (CI).
    #[test]
    fn every_builtin_kernel_waits_for_the_one_before_it() {
        let lines: Vec<&str> = SOURCE.lines().collect();
        let mut kernels = 0;
        for (i, line) in lines.iter().enumerate() {
            if !line.contains("__global__") {
                continue;
            }
            kernels += 1;
            let head = lines[i..(i + 8).min(lines.len())].join("\n");
            assert!(
                head.contains("GRID_ORDER();") || head.contains("matvec1_body<"),
                "a kernel that does not wait for the one before it: {line}"
            );
        }
        assert!(kernels > 15, "{kernels} kernels found");
        let body = SOURCE
            .split("void matvec1_body(")
            .nth(1)
            .expect("matvec1_body");
        let body = &body[..body.find("__syncthreads();").expect("its first barrier")];
        assert!(body.contains("GRID_LAUNCH_NEXT();") && body.contains("GRID_WAIT();"));
    }

    /// A source's own decode launch shape is read from it; one without the defines gets
    /// the built-in shape; a nonsense value is an error, not a launch.
    #[test]
    fn a_source_is_launched_by_its_own_shape() {
        let builtin = LaunchShape::of(SOURCE).unwrap();
        assert_eq!(
            builtin,
            LaunchShape {
                outs: MATVEC1_OUTS,
                warps: MATVEC1_WARPS,
                attend_warps: ATTEND_WARPS,
                tile_groups: ATTEND_TILE_GROUPS,
                attend_span: ATTEND_MMA_SPAN,
            }
        );
        // A source from before blocks took several parts is launched a block a part.
        let before_spans = SOURCE
            .lines()
            .filter(|l| !l.starts_with("#define AMMA_SPAN "))
            .collect::<Vec<_>>()
            .join("\n");
        assert_eq!(LaunchShape::of(&before_spans).unwrap().attend_span, 1);
        // Another source's values, each line replaced whatever the built-in value is.
        let with = |name: &str, value: &str| -> String {
            SOURCE
                .lines()
                .map(|l| match l.strip_prefix(&format!("#define {name} ")) {
                    Some(_) => format!("#define {name} {value}"),
                    None => l.to_string(),
                })
                .collect::<Vec<_>>()
                .join("\n")
        };
        let other = with("OUTS1", "3");
        let other = other.replace(
            &format!("#define MATVEC1_WARPS {MATVEC1_WARPS}"),
            "#define MATVEC1_WARPS 5",
        );
        let other = other.replace(
            &format!("#define ATTEND_WARPS {ATTEND_WARPS}"),
            "#define ATTEND_WARPS 7",
        );
        let other = other.replace(
            &format!("#define ATILE_GROUPS {ATTEND_TILE_GROUPS}"),
            "#define ATILE_GROUPS 3",
        );
        assert_eq!(
            LaunchShape::of(&other).unwrap(),
            LaunchShape {
                outs: 3,
                warps: 5,
                attend_warps: 7,
                tile_groups: 3,
                attend_span: ATTEND_MMA_SPAN,
            }
        );
        // 8 groups of 7 warps would be 1,792 threads; 16 groups, more named barriers.
        assert!(LaunchShape::of(
            &other.replace("#define ATILE_GROUPS 3", "#define ATILE_GROUPS 8")
        )
        .is_err());
        assert!(LaunchShape::of(&with("ATILE_GROUPS", "16")).is_err());
        let older: String = SOURCE
            .lines()
            .filter(|l| !l.starts_with("#define OUTS1") && !l.starts_with("#define MATVEC1_WARPS"))
            .filter(|l| !l.starts_with("#define ATTEND_WARPS"))
            .filter(|l| !l.starts_with("#define ATILE_GROUPS"))
            .collect::<Vec<_>>()
            .join("\n");
        assert_eq!(LaunchShape::of(&older).unwrap(), builtin);
        for bad in ["0", "x", "64"] {
            assert!(LaunchShape::of(&with("OUTS1", bad)).is_err(), "OUTS1 {bad}");
            assert!(
                LaunchShape::of(&with("ATTEND_WARPS", bad)).is_err(),
                "ATTEND_WARPS {bad}"
            );
        }
    }

    /// The launches size their grids by the source's constants: a kernel computing more
    /// outputs a warp, rows a block or keys a part than its launch assumes would leave
    /// outputs unwritten (or write past them), silently, on a device only. This holds the
    /// two sides together on every machine.
    #[test]
    fn the_launches_assume_the_sources_constants() {
        assert_eq!(define("OUTS"), MATVEC_OUTS as usize, "OUTS");
        assert_eq!(define("ROWS"), MATVEC_ROWS, "ROWS");
        assert_eq!(define("KEYS"), ATTEND_KEYS, "KEYS");
        assert_eq!(define("ATILE_ROWS"), ATTEND_TILE_ROWS, "ATILE_ROWS");
        assert_eq!(
            define("AMMA_WARPS"),
            ATTEND_MMA_WARPS as usize,
            "AMMA_WARPS"
        );
        assert_eq!(define("AMMA_PAIRS"), ATTEND_MMA_PAIRS, "AMMA_PAIRS");
        assert_eq!(define("AMMA_TILE"), ATTEND_MMA_TILE_PAIRS, "AMMA_TILE");
        assert_eq!(define("AMMA_CHUNK"), ATTEND_MMA_CHUNK, "AMMA_CHUNK");
        for hd in ATTEND_MMA_HEADS {
            assert!(
                SOURCE.contains(&format!("ATTEND_MMA({hd})")),
                "attend_mma_{hd}"
            );
        }
        assert!(SOURCE.contains("__launch_bounds__(32 * AMMA_WARPS) attend_mma_##HD("));
        assert!(
            SOURCE.contains("__launch_bounds__(32 * ATTEND_WARPS * ATILE_GROUPS) attend_tile_h(")
        );
        assert_eq!(
            define("ATILE_GROUPS"),
            ATTEND_TILE_GROUPS as usize,
            "ATILE_GROUPS"
        );
        assert_eq!(define("OUTS1"), MATVEC1_OUTS as usize, "OUTS1");
        assert_eq!(define("XSTRIDE"), MATVEC1_XSTRIDE, "XSTRIDE");
        // The fused norm sums as an `rms_norm` launch of ROW_THREADS threads does.
        assert_eq!(define("NORM_THREADS"), ROW_THREADS as usize, "NORM_THREADS");
        assert_eq!(
            define("MATVEC1_WARPS"),
            MATVEC1_WARPS as usize,
            "MATVEC1_WARPS"
        );
        assert!(SOURCE.contains("__launch_bounds__(32 * MATVEC1_WARPS) matvec1_"));
        assert_eq!(
            define("ATTEND_WARPS"),
            ATTEND_WARPS as usize,
            "ATTEND_WARPS"
        );
        use super::super::q8::{QHALF, QOUTS, QROWS, QWARPS};
        assert_eq!(define("QHALF"), QHALF, "QHALF");
        assert_eq!(define("QOUTS"), QOUTS as usize, "QOUTS");
        assert_eq!(define("QROWS"), QROWS, "QROWS");
        assert_eq!(define("QWARPS"), QWARPS as usize, "QWARPS");
        use super::super::q8::{MMQ_OUTS, MMQ_ROWS, MMQ_WARPS};
        assert_eq!(define("MMQ_ROWS"), MMQ_ROWS, "MMQ_ROWS");
        assert_eq!(define("MMQ_OUTS"), MMQ_OUTS as usize, "MMQ_OUTS");
        assert_eq!(define("MMQ_WARPS"), MMQ_WARPS as usize, "MMQ_WARPS");
        assert!(SOURCE.contains("__launch_bounds__(32 * MMQ_WARPS, BLOCKS) mmq_"));
        use super::super::q8::{MMQ_WEIGHT_BYTES, MMQ_XSTRIDE};
        assert_eq!(define("MMQ_XSTRIDE"), MMQ_XSTRIDE, "MMQ_XSTRIDE");
        assert_eq!(define("MMQ_W4K"), MMQ_WEIGHT_BYTES[0], "MMQ_W4K");
        assert_eq!(define("MMQ_W6K"), MMQ_WEIGHT_BYTES[1], "MMQ_W6K");
        // A Q4_K block decodes its outputs' scales two threads an output.
        assert_eq!(32 * MMQ_WARPS, 2 * MMQ_OUTS);
    }
}
