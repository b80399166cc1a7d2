//! `shardify`: convert Kaggle IceCube Parquet into pre-shuffled DOM-packed shards, and
//! inspect, dump or verify the result. Each command's code is in `commands/`.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::{Parser, Subcommand, ValueEnum};
use shardify::dataset::{dump::dump, ChecksumPolicy, Dataset};
use shardify::format::ShardLayout;

#[macro_use]
#[path = "common/console.rs"]
pub(crate) mod console;
#[path = "common/sampler_args.rs"]
mod sampler_args;

#[path = "commands/convert.rs"]
mod convert;
#[path = "commands/copy.rs"]
mod copy;
#[path = "commands/generate.rs"]
mod generate;
#[path = "commands/inspect.rs"]
mod inspect;
#[path = "commands/job_array.rs"]
mod job_array;
#[path = "commands/order.rs"]
mod order;
#[path = "commands/progress.rs"]
mod progress;
#[path = "commands/verify.rs"]
mod verify;

use convert::{run_convert, ConvertArgs};
use copy::run_copy;
use generate::{run_generate, GenerateArgs};
use inspect::run_inspect;
use order::{run_order, OrderArgs};
use verify::run_verify;

#[derive(Parser)]
#[command(
    name = "shardify",
    version,
    about = "Pre-shuffled, DOM-packed tensor shards from IceCube Kaggle Parquet files"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Write a synthetic Kaggle-layout source (batch files, meta, sensor geometry) of any
    /// size, with the real data's statistics by default: data to convert and to load
    /// without the download.
    Generate(GenerateArgs),
    /// Convert a Kaggle-layout directory (or explicit files) into a dataset directory.
    Convert(ConvertArgs),
    /// Print counts, distributions, sizes, seed and schema of a dataset.
    Inspect {
        /// Dataset directory.
        dataset: PathBuf,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Print every event as one JSON line, in stored order.
    Dump {
        /// Dataset directory.
        dataset: PathBuf,
        /// Only this event.
        #[arg(long)]
        event: Option<i64>,
    },
    /// Print, one line per batch, the event ids a rank receives, in order.
    Order(OrderArgs),
    /// Copy a dataset to another directory (a node's local disk), checking every file's
    /// checksum on the way; the copy is cached in huge pages where `cp`'s is not. Run
    /// again, it finds the copy there or finishes a stopped one; it waits for another copy
    /// into the same directory.
    Copy {
        /// Dataset directory to copy.
        dataset: PathBuf,
        /// New directory (absent or empty), or one this copy was made or stopped in.
        destination: PathBuf,
        /// Write the shards in this layout: `records` stores each event's pieces side by
        /// side (faster to load at random, but its DOM and pulse data are no longer plain
        /// safetensors arrays), `columns` as `convert` writes them. Default: the source's.
        #[arg(long, value_enum)]
        layout: Option<LayoutArg>,
        /// With the copy finished in DESTINATION already, read every file and compare it
        /// with the manifest's checksum, copying again the ones that differ or are missing
        /// (reads the whole copy; without it a finished copy is checked by its files'
        /// sizes).
        #[arg(long)]
        check: bool,
    },
    /// Check checksums and every invariant; with --against, compare with the source.
    Verify {
        /// Dataset directory.
        dataset: PathBuf,
        /// Kaggle-layout source directory to compare every pulse with.
        #[arg(long)]
        against: Option<PathBuf>,
        /// Split of the source directory, when it holds both.
        #[arg(long)]
        split: Option<String>,
    },
}

/// `--layout`: how shards store their events (convert, copy).
#[derive(Clone, Copy, ValueEnum)]
enum LayoutArg {
    Columns,
    Records,
}

impl From<LayoutArg> for ShardLayout {
    fn from(layout: LayoutArg) -> ShardLayout {
        match layout {
            LayoutArg::Columns => ShardLayout::Columns,
            LayoutArg::Records => ShardLayout::Records,
        }
    }
}

fn main() -> std::process::ExitCode {
    std::process::ExitCode::from(run_cli(std::env::args_os()))
}

/// The whole command line: parses `args` (the program name first), runs the command and
/// reports an error with its causes (quietly ends with [`console::CLOSED_STDOUT_STATUS`]
/// when stdout's reader has gone); returns the exit status. The Python package's
/// `shardify` console script calls this too, so both installs behave the same.
pub fn run_cli(args: impl IntoIterator<Item = std::ffi::OsString>) -> u8 {
    console::log_to_stderr();
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            // Help and version go to stdout with status 0, mistakes to stderr with 2.
            let _ = e.print();
            return e.exit_code().try_into().unwrap_or(2);
        }
    };
    console::exit_status(run(cli.command))
}

fn run(command: Command) -> Result<()> {
    match command {
        Command::Convert(args) => run_convert(args),
        Command::Inspect { dataset, json } => run_inspect(dataset, json),
        Command::Dump { dataset, event } => {
            let dataset = Dataset::open(&dataset, ChecksumPolicy::Lazy)?;
            let stdout = std::io::stdout();
            let mut out = std::io::BufWriter::new(stdout.lock());
            let written = dump(&dataset, event, &mut out)?;
            out.flush()?;
            if let (Some(id), 0) = (event, written) {
                bail!("event {id} is not in the dataset");
            }
            Ok(())
        }
        Command::Verify {
            dataset,
            against,
            split,
        } => run_verify(dataset, against, split),
        Command::Order(args) => run_order(args),
        Command::Copy {
            dataset,
            destination,
            layout,
            check,
        } => run_copy(dataset, destination, layout, check),
        Command::Generate(args) => run_generate(args),
    }
}
