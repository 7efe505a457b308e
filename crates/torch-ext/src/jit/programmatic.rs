//! Programmatic dependent launch (Hopper and later): a kernel launched
//! with CUDA's programmatic stream serialization may start while the kernel
//! before it on the stream is still finishing, and waits for that kernel's
//! results itself. A step of many short kernels (the small hosts' layers
//! run 2 - 6 us each) then overlaps each kernel's launch and block
//! dispatch with the tail of the one before.
//!
//! A kernel opts in by starting its body with [`PDL_ENTRY`]
//! (`ESPER_PDL_ENTRY();`), a macro [`super::compile`] defines for every
//! source: on sm_90 and later it lets the next kernel launch
//! (`griddepcontrol.launch_dependents`) and then waits until every kernel
//! this one depends on has finished and its writes are visible
//! (`griddepcontrol.wait`); before sm_90 it is empty. Waiting first thing
//! makes the overlap safe whatever the kernel reads or writes.
//!
//! A [`super::Cubin`] is launched this way only if every `__global__`
//! function in its source starts with the macro ([`source_is_programmatic`])
//! and it was compiled for sm_90 or later; anything else launches as
//! before. [`set_programmatic_launch`] turns the launch attribute off or on
//! for the whole process (the benchmarks measure both), and so does the
//! environment variable `ESPER_PDL=0` read at the first launch. A graph
//! keeps what was in force when it was captured.

use crate::ffi;

/// The statement a kernel starts its body with to opt in (see the module
/// docs).
pub const PDL_ENTRY: &str = "ESPER_PDL_ENTRY();";

/// Defines [`PDL_ENTRY`]'s macro; prepended to every compiled source, with a
/// `#line` so NVRTC's messages keep the source's own line numbers.
pub(super) const PRELUDE: &str = "#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900\n\
#define ESPER_PDL_ENTRY() asm volatile(\"griddepcontrol.launch_dependents;\\n\\tgriddepcontrol.wait;\" ::: \"memory\")\n\
#else\n\
#define ESPER_PDL_ENTRY() do { } while (0)\n\
#endif\n\
#line 1\n";

/// Whether every `__global__` function defined in `source` (comments
/// skipped; bodies in macros included) starts with [`PDL_ENTRY`], and there is
/// at least one. Declarations without a body are not counted.
pub fn source_is_programmatic(source: &str) -> bool {
    let code = strip_comments(source);
    let mut kernels = 0_usize;
    let mut rest = code.as_str();
    while let Some(at) = rest.find("__global__") {
        rest = &rest[at + "__global__".len()..];
        let open = rest.find('{');
        let end = rest.find(';');
        let Some(open) = open else { break };
        if end.is_some_and(|end| end < open) {
            continue; // a declaration
        }
        let body = rest[open + 1..].trim_start_matches(|c: char| c.is_whitespace() || c == '\\');
        if !body.starts_with(PDL_ENTRY) {
            return false;
        }
        kernels += 1;
        rest = &rest[open + 1..];
    }
    kernels > 0
}

/// `source` without `//` and `/* */` comments (string literals in kernel
/// source hold no comment markers).
fn strip_comments(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    loop {
        let line = rest.find("//");
        let block = rest.find("/*");
        let block_first = match (line, block) {
            (None, None) => {
                out.push_str(rest);
                return out;
            }
            (Some(l), Some(b)) => b < l,
            (None, Some(_)) => true,
            (Some(_), None) => false,
        };
        if let (Some(b), true) = (block, block_first) {
            out.push_str(&rest[..b]);
            out.push(' ');
            rest = rest[b + 2..]
                .find("*/")
                .map_or("", |e| &rest[b + 2 + e + 2..]);
        } else if let Some(l) = line {
            out.push_str(&rest[..l]);
            rest = rest[l..].find('\n').map_or("", |n| &rest[l + n..]);
        }
    }
}

/// Turns programmatic dependent launch on or off for every later launch of
/// this process (on by default, unless `ESPER_PDL=0`). Graphs captured
/// before keep what they captured.
pub fn set_programmatic_launch(enabled: bool) {
    // SAFETY: sets an atomic flag in the shim.
    unsafe { ffi::esper_jit_set_programmatic(i32::from(enabled)) }
}

/// Whether launches of opted-in kernels use programmatic dependent launch
/// now (see [`set_programmatic_launch`]).
pub fn programmatic_launch_enabled() -> bool {
    // SAFETY: reads an atomic flag in the shim.
    unsafe { ffi::esper_jit_programmatic() != 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kernel_must_start_with_the_entry() {
        let both = "extern \"C\" __global__ void a(int* x) {\n    ESPER_PDL_ENTRY();\n    x[0] = 1;\n}\n\
                    extern \"C\" __global__ void b(int* x) { ESPER_PDL_ENTRY(); x[1] = 2; }\n";
        assert!(source_is_programmatic(both));
        let one = format!("{both}extern \"C\" __global__ void c(int* x) {{ x[2] = 3; }}\n");
        assert!(!source_is_programmatic(&one));
        assert!(!source_is_programmatic("__device__ int f() { return 1; }"));
        assert!(!source_is_programmatic(""));
    }

    #[test]
    fn comments_declarations_and_macro_bodies() {
        // A comment naming __global__ and a declaration are not kernels.
        let source = "// __global__ in a comment {\n/* __global__ { */\n\
                      extern \"C\" __global__ void a(int* x);\n\
                      #define K(N) extern \"C\" __global__ void k##N(int* x) { \\\n    ESPER_PDL_ENTRY(); \\\n    x[N] = N; \\\n}\n\
                      K(1) K(2)\n";
        assert!(source_is_programmatic(source));
        let no_entry =
            "#define K(N) extern \"C\" __global__ void k##N(int* x) { \\\n    x[N] = N; \\\n}\n";
        assert!(!source_is_programmatic(no_entry));
        // An entry commented out does not count.
        assert!(!source_is_programmatic(
            "extern \"C\" __global__ void a(int* x) { // ESPER_PDL_ENTRY();\n x[0] = 1; }"
        ));
    }

    #[test]
    fn the_prelude_defines_the_entry_macro_for_every_architecture() {
        assert!(PRELUDE.contains("#define ESPER_PDL_ENTRY()"));
        assert!(PRELUDE.contains("griddepcontrol.wait"));
        assert!(PRELUDE.ends_with("#line 1\n"));
        // A kernel with the entry compiles before and after sm_90.
        let source = "extern \"C\" __global__ void a(int* x) { ESPER_PDL_ENTRY(); x[0] = 1; }";
        for arch in [(8, 0), (9, 0)] {
            let cubin = super::super::compile(source, "a", arch).expect("compiles");
            assert_eq!(cubin.programmatic(), arch.0 >= 9, "{arch:?}");
        }
    }
}
