//! `curvine-bench`: the benchmark tool. Its actions arrive with the
//! benchmark work; until then it says so instead of pretending to measure.

fn main() {
    eprintln!("curvine-bench: no benchmark actions are implemented in this release");
    std::process::exit(2);
}
