//! `shardify-gen`: `shardify generate` as a binary of its own (the same arguments and
//! code), for scripts written before the subcommand.

use clap::Parser;

#[macro_use]
#[path = "../src/bin/common/console.rs"]
mod console;
#[path = "../src/bin/commands/generate.rs"]
mod generate;

/// Write a synthetic Kaggle-layout dataset (batch files, meta, sensor geometry); the same
/// as `shardify generate`.
#[derive(Parser)]
#[command(name = "shardify-gen", version)]
struct Cli {
    #[command(flatten)]
    args: generate::GenerateArgs,
}

fn main() -> std::process::ExitCode {
    console::log_to_stderr();
    // A closed stdout ends the run quietly with the status `shardify` gives it (141).
    std::process::ExitCode::from(console::exit_status(generate::run_generate(
        Cli::parse().args,
    )))
}
