//! `cargo x book [--serve]`: builds the book into `book/book/` (or serves it, rebuilding on
//! every change) with the mdBook and mdbook-katex versions it is written for, installed into
//! `.cache/tools/` on first use, as `cargo x test` does. Then checks the built pages load
//! nothing over the network.

use anyhow::{Result, ensure};

use crate::{check, test};

#[derive(clap::Args)]
pub struct Args {
    /// Serve the book on http://localhost:3000 and rebuild it on every change.
    #[arg(long)]
    serve: bool,
}

pub fn run(args: Args) -> Result<()> {
    let tools_bin = test::install_book_tools()?;
    let action = if args.serve { "serve" } else { "build" };
    let status = test::mdbook_command(&tools_bin, action)?.status()?;
    ensure!(status.success(), "mdbook {action} failed");
    let remote = check::built_book_is_offline()?;
    for load in &remote {
        eprintln!("check: {load}");
    }
    ensure!(remote.is_empty(), "the built book loads {} thing(s) over the network", remote.len());
    println!("book: built into book/book/ (open book/book/index.html)");
    Ok(())
}
