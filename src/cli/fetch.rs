//! `kvbench fetch`: make sure the default model is on disk.

use crate::model::fetch;

/// Arguments of `kvbench fetch`.
#[derive(Debug, clap::Args)]
pub struct FetchArgs {
    /// Also print the model file's sha256.
    #[arg(long)]
    pub sha256: bool,
}

/// Fetches (if needed) and prints the path.
pub fn run(args: FetchArgs) -> anyhow::Result<()> {
    let path = fetch::ensure_default_model()?;
    println!("{}", path.display());
    if args.sha256 {
        println!("{}", fetch::sha256_file(&path)?);
    }
    Ok(())
}
