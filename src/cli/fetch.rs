//! `kvbench fetch`: make sure the default model is on disk.

use crate::model::fetch;

/// Arguments of `kvbench fetch`.
#[derive(Debug, clap::Args)]
pub struct FetchArgs {
    /// Also print the model file's sha256.
    #[arg(long)]
    pub sha256: bool,
}

/// Fetches (if needed), checks the file's sha256 (fetching again when a cached copy is damaged)
/// and prints the path.
pub fn run(args: FetchArgs) -> anyhow::Result<()> {
    let mut path = fetch::ensure_default_model()?;
    // A cached copy is checked against its sha256; a damaged one is moved aside and fetched
    // again.
    if let Err(e) = fetch::verify_default_model(&path) {
        eprintln!("kvbench: {e}; fetching it again");
        path = fetch::ensure_default_model()?;
        fetch::verify_default_model(&path)?;
    }
    println!("{}", path.display());
    if args.sha256 {
        println!("{}", fetch::sha256_file(&path)?);
    }
    Ok(())
}
