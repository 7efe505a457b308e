//! Programmatic dependent launch: letting a run-time compiled kernel be
//! launched before the kernel ahead of it on the stream has finished.
//!
//! On GPUs of compute capability 9.0 and above, a kernel launched with
//! CUDA's programmatic-stream-serialization attribute may be scheduled while
//! its predecessor is still running; it must then wait, in the kernel, for
//! the predecessor to complete (`griddepcontrol.wait`) before it touches
//! memory. The overlap hides the launch and ramp-up of one small kernel
//! behind the tail of the previous one, inside CUDA graphs too; a training
//! step of many short kernels is where that pays.
//!
//! The contract is per kernel and visible in its source: a kernel opts in by
//! making [`ENTRY`] the first statement of its body. The macro (defined by
//! [`PRELUDE`], which [`crate::jit::compile`] puts before every source)
//! waits for the predecessor grid and its memory, then lets the next kernel
//! be scheduled. A kernel whose body does not begin with it is launched the
//! ordinary way, whatever else the source holds, so a kernel can never run
//! early without waiting. [`waiting_kernels`] reads the source to decide.
//!
//! `ESPER_PDL=0` (or `off`, `false`) turns the early launch off for the
//! whole process; `1`, `on`, `true` or no value leave it on. Any other value
//! is an error at kernel load, naming the variable.
//!
//! (Not a doctest, as everywhere in torch-ext: a doctest binary would not
//! find libtorch; the unit tests below read the same sources.)
//!
//! ```ignore
//! use torch_ext::pdl::{ENTRY, waiting_kernels};
//! let source = format!(
//!     r#"extern "C" __global__ void __launch_bounds__(256) scale(float* x, long long n) {{
//!            {ENTRY}
//!            long long i = blockIdx.x * 256LL + threadIdx.x;
//!            if (i < n) x[i] *= 2.0f;
//!        }}
//!        extern "C" __global__ void plain(float* x) {{ x[0] = 1.0f; }}"#
//! );
//! let early = waiting_kernels(&source);
//! assert_eq!(early.len(), 1);
//! assert!(early[0].matches("scale"));
//! ```

use std::sync::OnceLock;

use crate::error::{Error, Result};

/// The statement a kernel's body begins with to be launched early.
pub const ENTRY: &str = "ESPER_PDL_ENTRY();";

/// The variable that turns the early launch off (`0`, `off`, `false`).
pub const ENV_PDL: &str = "ESPER_PDL";

/// The macro definitions every compiled source is given (a no-op below
/// compute capability 9.0, where the instructions do not exist). The wait
/// comes first, so nothing of the kernel reads or writes memory before its
/// predecessor has completed and flushed.
pub const PRELUDE: &str = "#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)\n\
#define ESPER_PDL_ENTRY() do { asm volatile(\"griddepcontrol.wait;\" ::: \"memory\"); \
asm volatile(\"griddepcontrol.launch_dependents;\" ::: \"memory\"); } while (0)\n\
#else\n\
#define ESPER_PDL_ENTRY() do { } while (0)\n\
#endif\n";

/// One `__global__` kernel of a source: its name as declared and whether
/// its body begins with [`ENTRY`] (only whitespace and line splices before
/// it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kernel {
    /// The name as written; a kernel declared inside a macro may paste its
    /// name together from the macro's parameters (`conv_c##C##_n##N`).
    pub declared: String,
    /// Whether the body begins with [`ENTRY`].
    pub waits: bool,
    pieces: Vec<Piece>,
}

/// A piece of a declared name: literal text, or a macro parameter (any
/// identifier characters).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Text(String),
    Parameter,
}

impl Kernel {
    /// Whether the kernel loaded as `name` is this declaration (a pasted
    /// name matches any identifier characters where a parameter stands).
    pub fn matches(&self, name: &str) -> bool {
        fn rest(pieces: &[Piece], name: &str) -> bool {
            match pieces.split_first() {
                None => name.is_empty(),
                Some((Piece::Text(text), tail)) => name
                    .strip_prefix(text.as_str())
                    .is_some_and(|after| rest(tail, after)),
                Some((Piece::Parameter, tail)) => (1..=name.len()).any(|split| {
                    name.get(..split).is_some_and(|head| {
                        head.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                    }) && name.get(split..).is_some_and(|after| rest(tail, after))
                }),
            }
        }
        rest(&self.pieces, name)
    }
}

/// Every `__global__` kernel in `source`, in the order they appear.
pub fn kernels(source: &str) -> Vec<Kernel> {
    let mut found = Vec::new();
    let mut offset = 0_usize;
    while let Some(at) = source
        .get(offset..)
        .and_then(|rest| rest.find("__global__"))
    {
        let start = offset + at + "__global__".len();
        let Some((declared, waits, consumed)) = source.get(start..).and_then(one_kernel) else {
            break;
        };
        let parameters = if declared.contains("##") {
            source
                .get(..start)
                .map(macro_parameters)
                .unwrap_or_default()
        } else {
            Vec::new()
        };
        let pieces = declared
            .split("##")
            .map(str::trim)
            .map(|piece| {
                if parameters.iter().any(|p| p == piece) {
                    Piece::Parameter
                } else {
                    Piece::Text(piece.to_owned())
                }
            })
            .collect();
        found.push(Kernel {
            declared,
            waits,
            pieces,
        });
        offset = start + consumed;
    }
    found
}

/// The kernels of `source` that begin with [`ENTRY`] and so may be launched
/// early.
pub fn waiting_kernels(source: &str) -> Vec<Kernel> {
    kernels(source)
        .into_iter()
        .filter(|kernel| kernel.waits)
        .collect()
}

/// Whether early launch is on for this process (read once from
/// [`ENV_PDL`]); an unknown value is an error naming the variable.
pub fn enabled() -> Result<bool> {
    static SETTING: OnceLock<std::result::Result<bool, String>> = OnceLock::new();
    SETTING
        .get_or_init(|| parse_setting(std::env::var(ENV_PDL).ok().as_deref()))
        .clone()
        .map_err(|message| Error::InvalidArgument {
            op: "jit::load",
            message,
        })
}

fn parse_setting(value: Option<&str>) -> std::result::Result<bool, String> {
    match value.map(str::trim) {
        None | Some("" | "1" | "on" | "true") => Ok(true),
        Some("0" | "off" | "false") => Ok(false),
        Some(other) => Err(format!(
            "{ENV_PDL}={other:?}: expected 1, on, true (early kernel launch) or 0, off, false"
        )),
    }
}

/// After `__global__`: the kernel's declared name, whether its body begins
/// with [`ENTRY`], and how many bytes of `text` up to the body's opening
/// brace.
fn one_kernel(text: &str) -> Option<(String, bool, usize)> {
    let mut from = 0_usize;
    loop {
        let open = from + text.get(from..)?.find('(')?;
        let before = text.get(from..open)?.trim_end();
        let name_start = before
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '#'))
            .map_or(0, |at| at + 1);
        let name = before.get(name_start..)?.to_owned();
        let after_params = open + skip_parens(text.get(open..)?)?;
        if name == "__launch_bounds__" {
            from = after_params;
            continue;
        }
        let rest = text.get(after_params..)?;
        let brace = after_params + (rest.len() - rest.trim_start().len());
        let body = text.get(brace..)?.strip_prefix('{')?;
        // Whitespace, and a macro's line splices (`\` at a line's end).
        let waits = body
            .trim_start_matches(|c: char| c.is_whitespace() || c == '\\')
            .starts_with(ENTRY);
        return (!name.is_empty()).then_some((name, waits, brace + 1));
    }
}

/// The parameters of the last `#define NAME(a, b)` in `text`, if the
/// kernel that follows it is declared inside that macro.
fn macro_parameters(text: &str) -> Vec<String> {
    let Some(at) = text.rfind("#define") else {
        return Vec::new();
    };
    let line = text
        .get(at + "#define".len()..)
        .and_then(|rest| rest.lines().next())
        .unwrap_or("")
        .trim_start();
    // A function-like macro: its name, then `(` at once.
    let name_end = line
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(line.len());
    let Some(list) = line.get(name_end..).and_then(|rest| rest.strip_prefix('(')) else {
        return Vec::new();
    };
    list.get(..list.find(')').unwrap_or(list.len()))
        .unwrap_or("")
        .split(',')
        .map(|p| p.trim().to_owned())
        .filter(|p| !p.is_empty())
        .collect()
}

/// `text` starts with `(`: how many bytes up to and including its matching
/// `)`.
fn skip_parens(text: &str) -> Option<usize> {
    let mut depth = 0_usize;
    for (at, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(at + 1);
                }
            }
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_kernels_that_wait_first_are_early() {
        let source = r#"
extern "C" __global__ void __launch_bounds__(128, 2) a(const float* __restrict__ x, float* y) {
    ESPER_PDL_ENTRY();
    y[0] = x[0];
}
extern "C" __global__ void b(float* y) {
    y[0] = 1.0f;
    ESPER_PDL_ENTRY();
}
extern "C" __global__ void c(float* y) {
    // a comment first: not early (conservative)
    ESPER_PDL_ENTRY();
}
__device__ float helper(float v) { return v; }
extern "C" __global__ void d(int n, float* y) {ESPER_PDL_ENTRY(); if (n) y[0] = helper(1.0f); }
"#;
        let found: Vec<(String, bool)> = kernels(source)
            .into_iter()
            .map(|kernel| (kernel.declared, kernel.waits))
            .collect();
        assert_eq!(
            found,
            vec![
                ("a".to_owned(), true),
                ("b".to_owned(), false),
                ("c".to_owned(), false),
                ("d".to_owned(), true)
            ]
        );
        let early: Vec<String> = waiting_kernels(source)
            .into_iter()
            .map(|kernel| kernel.declared)
            .collect();
        assert_eq!(early, vec!["a".to_owned(), "d".to_owned()]);
        assert!(kernels("__global__ void broken(").is_empty());
        assert!(kernels("no kernels").is_empty());
    }

    #[test]
    fn names_pasted_in_a_macro_match_their_instances() {
        let source = "#define K(C8, NT) \\\n\
            extern \"C\" __global__ void conv_c##C8##_n##NT(float* y) { \\\n\
            ESPER_PDL_ENTRY(); y[0] = C8 * NT; }\n\
            K(1, 2) K(4, 4)\n";
        let found = kernels(source);
        assert_eq!(found.len(), 1, "{found:?}");
        let kernel = &found[0];
        assert!(kernel.waits);
        assert!(kernel.matches("conv_c1_n2"));
        assert!(kernel.matches("conv_c4_n4"));
        assert!(!kernel.matches("conv_c1"));
        assert!(!kernel.matches("conv_c1_m2"));
        assert!(!kernel.matches("other"));
        let plain = &kernels("__global__ void plain(int n) { ESPER_PDL_ENTRY(); }")[0];
        assert!(plain.matches("plain"));
        assert!(!plain.matches("plainer"));
    }

    #[test]
    fn the_switch_accepts_known_values_and_names_itself_otherwise() {
        assert_eq!(parse_setting(None), Ok(true));
        assert_eq!(parse_setting(Some("1")), Ok(true));
        assert_eq!(parse_setting(Some(" off ")), Ok(false));
        assert_eq!(parse_setting(Some("0")), Ok(false));
        let message = parse_setting(Some("maybe")).expect_err("unknown");
        assert!(
            message.contains(ENV_PDL) && message.contains("maybe"),
            "{message}"
        );
    }

    /// Every kernel this crate compiles opts in: a kernel added without the
    /// wait would be launched the ordinary way, slower, so say which.
    #[test]
    fn every_kernel_of_the_crate_waits_first() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut missing = Vec::new();
        let mut seen = 0_usize;
        let mut stack = vec![root];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).expect("src is readable") {
                let path = entry.expect("a directory entry").path();
                if path.is_dir() {
                    stack.push(path);
                    continue;
                }
                let file = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
                // This file's and jit.rs's examples are not kernels of the crate.
                if !file.ends_with(".rs") || file == "pdl.rs" || file == "jit.rs" {
                    continue;
                }
                let text = std::fs::read_to_string(&path).expect("a source file");
                for kernel in kernels(&text) {
                    seen += 1;
                    if !kernel.waits {
                        missing.push(format!("{file}: {}", kernel.declared));
                    }
                }
            }
        }
        assert!(seen > 30, "only {seen} kernels found");
        assert!(missing.is_empty(), "kernels without {ENTRY}: {missing:?}");
    }
}
