//! `cargo xtask bench`: builds release and runs the benchmark workloads.

use std::path::Path;

use anyhow::{Result, bail};

/// Options of `cargo xtask bench`.
#[derive(Debug, Default)]
pub(crate) struct Options {
    pub(crate) label: Option<String>,
    pub(crate) workloads: Vec<String>,
    pub(crate) compare: Option<String>,
    pub(crate) quick: bool,
}

impl Options {
    pub(crate) fn parse(args: &[String]) -> Result<Options> {
        let mut options = Options::default();
        let mut args = args.iter();
        while let Some(arg) = args.next() {
            let mut value = |flag: &str| -> Result<String> {
                match args.next() {
                    Some(value) => Ok(value.clone()),
                    None => bail!("{flag} needs a value"),
                }
            };
            match arg.as_str() {
                "--label" => options.label = Some(value("--label")?),
                "--workload" => options.workloads.push(value("--workload")?),
                "--compare" => options.compare = Some(value("--compare")?),
                "--quick" => options.quick = true,
                other => bail!("unknown bench option `{other}` (see `cargo xtask help`)"),
            }
        }
        Ok(options)
    }
}

pub(crate) fn run(_root: &Path, _options: &Options) -> Result<()> {
    bail!(
        "no benchmark workload is implemented yet: `cargo xtask bench` provisions libtorch and \
         stops here until the Tolaria fast path lands"
    )
}
