//! The command line of `mrstack`: its options ([`Cli`]) and their parsing ([`parse`]), kept in the
//! library so that tests can drive them without starting the binary.

use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};
use mrstack::leaf::Simulated;
use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Arc;

/// The most allocations `--allocations` accepts: the random workload is built in memory (about
/// 70 bytes per allocation) before it is replayed.
pub const MAX_RANDOM_ALLOCATIONS: u64 = 10_000_000;

/// The exit statuses, for the help.
pub const EXIT_STATUS: &str = "\
Exit status:
  0  every stack replayed and measured (or the workload has nothing to time)
  1  the trace cannot be read or has a bad line (under --on-error stop), a stack failed to
     replay or to complete the capacity search, or --upstream cuda found no GPU
  2  usage error: an unknown option, a bad value, an unknown stack name";

/// CUDA memory resources composed at compile time: tools.
#[derive(Debug, Parser)]
#[command(name = "mrstack", version, after_help = EXIT_STATUS)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Replay an allocation log, or the built-in random workload, through preset resource stacks,
    /// print each stack's speed and memory, and end with the stack to use.
    ///
    /// For each stack: ns per op (the median of --passes timed passes after a warm-up pass, each
    /// stack built with twice the workload's peak live bytes as its capacity; over Simulated, host
    /// bookkeeping only), the peak bytes it took from its upstream, the workload's peak live bytes,
    /// and the minimum capacity with which the workload completes (a search over Simulated, on any
    /// machine), as a ratio to peak live.
    ///
    /// The stack to use is printed as a resource_stack! block and as a text config, ready to paste:
    /// the least minimum capacity first, a fixed order of speed among stacks within 5% of it, and
    /// its minimum capacity plus 10% headroom. It never rests on timings, so every run of the same
    /// log recommends the same.
    ///
    /// A log is RMM's CSV, Thread,Time,Action,Pointer,Size,Stream, plain or gzip-compressed: what
    /// RMM's logging_resource_adaptor and mrstack's Logging adaptor write. The threads of a
    /// many-threaded log replay on threads of their own (at most 256 OS threads), each keeping
    /// its order.
    Replay(ReplayArgs),
}

/// The options of `mrstack replay`.
#[derive(Debug, Args)]
// A later --passes (or any option) wins over an earlier one, so scripts can append to a command.
#[command(args_override_self = true)]
pub struct ReplayArgs {
    /// The allocation log (CSV, plain or .gz); without it, the built-in random workload.
    pub trace: Option<PathBuf>,

    /// Stacks to replay through, by name: repeat the option or separate names with commas.
    /// Default: all (see the list below).
    #[arg(short, long = "stack", value_name = "NAME", value_delimiter = ',')]
    pub stacks: Vec<String>,

    /// The memory the stacks sit on: a GPU (device 0), or Simulated (address ranges and exact
    /// accounting, no memory: any machine, any trace size). Default: cuda when a GPU opens,
    /// else simulated.
    #[arg(long, value_enum, default_value_t = UpstreamArg::Auto)]
    pub upstream: UpstreamArg,

    /// Timed passes per stack (after one warm-up pass); ns/op is their median.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub passes: u32,

    /// Relative precision of the minimum-capacity search, between 0 and 1 (0.001 = 0.1%).
    #[arg(long, default_value_t = 0.001, value_parser = precision)]
    pub precision: f64,

    /// Skip the minimum-capacity search.
    #[arg(long)]
    pub no_capacity: bool,

    /// Replay a many-threaded log in log order on one thread, instead of with its threads.
    #[arg(long)]
    pub sequential: bool,

    /// What to do with a bad line of the log (malformed, a free of an unknown pointer, a file cut
    /// short): stop with an error naming it, or leave it out, count it and replay the rest.
    #[arg(long, value_enum, default_value_t = OnErrorArg::Stop)]
    pub on_error: OnErrorArg,

    /// Allocations of the built-in random workload (without TRACE).
    /// At most 10,000,000: the workload is built in memory before it is replayed.
    #[arg(long, default_value_t = 10_000, conflicts_with = "trace",
          value_parser = clap::value_parser!(u64).range(0..=MAX_RANDOM_ALLOCATIONS))]
    pub allocations: u64,

    /// Seed of the built-in random workload (without TRACE).
    #[arg(long, conflicts_with = "trace")]
    pub seed: Option<u64>,

    /// Print the report as JSON on stdout instead of the table.
    #[arg(long)]
    pub json: bool,

    /// No progress bar (there is none either where stderr is not a terminal).
    #[arg(short, long)]
    pub quiet: bool,
}

/// `--upstream`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum UpstreamArg {
    /// cuda if a GPU opens, else simulated.
    Auto,
    /// Simulated: no memory, exact accounting.
    Simulated,
    /// Device memory of GPU 0 (cuMemAlloc).
    Cuda,
}

/// `--on-error`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OnErrorArg {
    /// Stop with an error naming the bad line (exit status 1).
    Stop,
    /// Leave bad lines out, count them, replay the rest.
    Skip,
}

/// Parses `--precision`: a number strictly between 0 and 1.
fn precision(text: &str) -> Result<f64, String> {
    let p: f64 = text
        .parse()
        .map_err(|_| format!("`{text}` is not a number"))?;
    if p > 0.0 && p < 1.0 {
        Ok(p)
    } else {
        Err(format!("{p} is not between 0 and 1 (exclusive)"))
    }
}

/// The stack that `cuda-async` names: the driver's own pool, which sits on no upstream.
pub const CUDA_ASYNC: &str = "cuda-async";

/// The stack names, for the help: the table's, plus `cuda-async` on a GPU.
pub fn stack_list() -> String {
    let names: Vec<String> = mrstack::replay::stacks::<Arc<Simulated>>()
        .iter()
        .map(|s| match s.name() {
            "upstream" => "upstream (the upstream itself; alias `cuda` or `simulated`)".to_owned(),
            name => name.to_owned(),
        })
        .collect();
    format!(
        "Stacks: {}, and {CUDA_ASYNC} (the driver's stream-ordered pool; --upstream cuda \
         only).\n\n{EXIT_STATUS}",
        names.join(", ")
    )
}

/// The command, with the stack list and the exit statuses in `replay --help`.
pub fn command() -> clap::Command {
    Cli::command().mut_subcommand("replay", |c| c.after_help(stack_list()))
}

/// Parses a command line (`args[0]` is the program's name). `Err` for a usage error, and for
/// `--help` and `--version` (whose text the error holds): [`clap::Error::exit`] prints it.
pub fn parse<I, T>(args: I) -> Result<Cli, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let matches = command().try_get_matches_from(args)?;
    Cli::from_arg_matches(&matches)
}
