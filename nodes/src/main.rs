//! `curvine-node`: runs one node of a cluster.

use clap::{Parser, Subcommand};

use curvine_conf::Loader;

#[derive(Parser)]
#[command(
    name = "curvine-node",
    version,
    about = "A node of a curvine cache cluster"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start a node. Without options: a single-node cluster on embedded defaults.
    Start {
        /// Config file (TOML); also CURVINE_CONF.
        #[arg(long)]
        conf: Option<String>,
        /// Data directory (node.data_dir).
        #[arg(long)]
        data_dir: Option<String>,
        /// Client port address, host:port (node.listen).
        #[arg(long)]
        listen: Option<String>,
        /// Cluster ports of nodes to join, comma-separated (node.seeds).
        #[arg(long)]
        seeds: Option<String>,
        /// Set any config key: -c section.key=value (repeatable).
        #[arg(short = 'c', long = "config", value_name = "KEY=VALUE")]
        overrides: Vec<String>,
    },
}

fn main() {
    let cli = Cli::parse();
    let Command::Start {
        conf,
        data_dir,
        listen,
        seeds,
        overrides,
    } = cli.command;
    let loader = (|| {
        let mut loader = Loader::standard(conf.as_deref(), &overrides)?;
        if let Some(v) = &data_dir {
            loader.flag("node.data_dir", v, "--data-dir")?;
        }
        if let Some(v) = &listen {
            loader.flag("node.listen", v, "--listen")?;
        }
        if let Some(v) = &seeds {
            loader.flag("node.seeds", v, "--seeds")?;
        }
        let config = loader.build()?;
        Ok::<_, curvine_conf::ConfError>(config)
    })();
    let config = match loader {
        Ok(c) => c,
        Err(e) => {
            eprintln!("curvine-node: {e}");
            std::process::exit(2);
        }
    };
    // ractor_cluster reports every session step at info; its problems show
    // at warn, and membership logs what an operator needs. s3s logs every
    // failed S3 request at error (a GET of a missing key, a bad signature):
    // the gateway logs the failures that are the node's own.
    let mut level = config.log.level.clone();
    for (target, quiet) in [("ractor_cluster", "warn"), ("s3s", "off")] {
        if !level.contains(target) {
            level = format!("{level},{target}={quiet}");
        }
    }
    let filter = tracing_subscriber::EnvFilter::try_new(&level)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colours only on a terminal: a log file or journal gets plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();

    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("curvine-node: cannot start the runtime: {e}");
            std::process::exit(1);
        }
    };
    let code = runtime.block_on(async move {
        let node = match curvine_node::node::start(&config).await {
            Ok(node) => node,
            // Unusable TLS files are a bad setting, like any bad config value.
            Err(e @ curvine_node::node::StartError::Tls(_)) => {
                eprintln!("curvine-node: {e}");
                return 2;
            }
            Err(e) => {
                eprintln!("curvine-node: {e}");
                return 1;
            }
        };
        let mut node = node;
        let id = &node.data_dir.identity;
        eprintln!(
            "curvine-node: data directory {} ({} cluster {} with {} shards)",
            node.data_dir.path.display(),
            if !node.data_dir.formatted_now {
                "reopened"
            } else if node.data_dir.identity.founder {
                "formatted new"
            } else {
                "joined"
            },
            id.cluster_id,
            id.shard_count
        );
        if id.meta_layout != config.meta.layout {
            eprintln!(
                "curvine-node: meta.layout is {:?} but this data directory was formatted with {:?}; keeping {:?}",
                config.meta.layout, id.meta_layout, id.meta_layout
            );
        }
        if !config.node.seeds.is_empty() {
            eprintln!("curvine-node: seeds {}", config.node.seeds.join(","));
        }
        eprintln!(
            "curvine-node: node {} serving clients on {} (cluster port {}, data port {})",
            id.node_id, node.rpc_addr, node.cluster_addr, node.data_addr
        );
        if let Some(http) = &node.http {
            eprintln!(
                "curvine-node: dashboard http://{}/ and metrics http://{}/metrics",
                http.addr, http.addr
            );
        }
        if !node.s3_addr.is_empty() {
            eprintln!("curvine-node: S3 gateway http://{}/", node.s3_addr);
        }
        for tier in node.blocks.stats() {
            eprintln!(
                "curvine-node: tier {} at {} with {} capacity",
                tier.kind,
                tier.path,
                curvine_actors::blocks::human(tier.capacity)
            );
        }
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("curvine-node: cannot watch SIGTERM: {e}");
                return 1;
            }
        };
        let failed = tokio::select! {
            _ = tokio::signal::ctrl_c() => false,
            _ = term.recv() => false,
            _ = &mut node.supervisor_done => true,
        };
        if failed {
            eprintln!("curvine-node: the supervision tree stopped after repeated failures; see the log above");
            return 1;
        }
        eprintln!("curvine-node: stopping");
        node.stop().await;
        eprintln!("curvine-node: stopped");
        0
    });
    std::process::exit(code);
}
